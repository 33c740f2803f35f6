package main

import (
	"reflect"
	"regexp"
	"strings"

	"github.com/agext/levenshtein"
)

// unknownFieldRe reads the field name out of encoding/json's error for a
// field DisallowUnknownFields refuses: the package has no typed error
// for it.
var unknownFieldRe = regexp.MustCompile(`^json: unknown field "(.*)"$`)

// jsonFields are the JSON names of the fields of the struct v points to,
// read from its tags, so that a suggestion never drifts from what the
// decoder takes.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

// nearest is the one of known closest to name, as cargo and HCL suggest
// (HCL with the same Levenshtein distance): within an edit distance of 2
// (1 for a name of 4 letters or fewer, so that "cmd" is not taken for
// "id"), or name a prefix of it; "" when none is.
func nearest(name string, known []string) string {
	limit := 2
	if len(name) <= 4 {
		limit = 1
	}
	lower := strings.ToLower(name)
	best, bestD := "", limit+1
	for _, k := range known {
		d := levenshtein.Distance(lower, k, nil)
		if strings.HasPrefix(k, lower) && len(name) >= 3 {
			d = min(d, limit)
		}
		if d < bestD {
			best, bestD = k, d
		}
	}
	return best
}
