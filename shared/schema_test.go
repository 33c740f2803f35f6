package shared

import (
	"strings"
	"testing"
)

// TestSchemaValidate: a schema the host cannot decode against (a type it
// does not know, a name twice, a name the host keeps for itself, a name
// missing) is refused with the path to the fault; names may repeat in
// different bodies, and a block's labels are names in its body.
func TestSchemaValidate(t *testing.T) {
	t.Parallel()
	profile := func(body *Schema) BlockType {
		return BlockType{Name: "profile", Labels: []string{"name"}, Body: body}
	}
	tests := []struct {
		name     string
		schema   *Schema
		reserved []string
		err      string // "" for valid; else a fragment of the error
	}{
		{"nil", nil, []string{"plugin"}, ""},
		{"empty", &Schema{}, nil, ""},
		{"every type", &Schema{Attributes: []Attribute{
			{Name: "a", Type: TypeString}, {Name: "b", Type: TypeBool}, {Name: "c", Type: TypeInt},
			{Name: "d", Type: TypeNumber}, {Name: "e", Type: TypeListString}, {Name: "f", Type: TypeDuration},
		}}, nil, ""},
		{"unknown type", &Schema{Attributes: []Attribute{{Name: "a", Type: "map"}}}, nil, `schema: attribute "a" has unknown type "map"`},
		{"no name", &Schema{Attributes: []Attribute{{Type: TypeString}}}, nil, "has no name"},
		{"attribute twice", &Schema{Attributes: []Attribute{{Name: "a", Type: TypeString}, {Name: "a", Type: TypeInt}}}, nil, `"a" is declared twice`},
		{"attribute and block of one name", &Schema{Attributes: []Attribute{{Name: "profile", Type: TypeString}},
			Blocks: []BlockType{profile(nil)}}, nil, `"profile" is declared twice`},
		{"reserved by the host", &Schema{Attributes: []Attribute{{Name: "sha256", Type: TypeString}}}, []string{"plugin", "sha256"}, `"sha256" is declared twice or is reserved`},
		{"reserved only at the top", &Schema{Blocks: []BlockType{profile(&Schema{Attributes: []Attribute{{Name: "plugin", Type: TypeString}}})}}, []string{"plugin"}, ""},
		{"a name again in a block body", &Schema{Attributes: []Attribute{{Name: "cpus", Type: TypeInt}},
			Blocks: []BlockType{profile(&Schema{Attributes: []Attribute{{Name: "cpus", Type: TypeInt}}})}}, nil, ""},
		{"a block attribute named as its label", &Schema{Blocks: []BlockType{profile(&Schema{Attributes: []Attribute{{Name: "name", Type: TypeString}}})}}, nil, `schema.profile: "name" is declared twice`},
		{"a fault deep down", &Schema{Blocks: []BlockType{profile(&Schema{Blocks: []BlockType{{Name: "env", Body: &Schema{Attributes: []Attribute{{Name: "x", Type: "float"}}}}}})}}, nil, `schema.profile.env: attribute "x" has unknown type "float"`},
		{"a block without a body", &Schema{Blocks: []BlockType{{Name: "empty"}}}, nil, ""},
	}
	for _, tc := range tests {
		err := tc.schema.Validate(tc.reserved...)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v; want valid", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v; want an error with %q", tc.name, err, tc.err)
		}
	}
}
