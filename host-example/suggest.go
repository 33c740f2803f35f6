package main

import (
	"reflect"
	"regexp"
	"strings"
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

// nearest is the one of known closest to name, as cargo and HCL suggest:
// within an edit distance of 2 (1 for a name of 4 letters or fewer, so
// that "cmd" is not taken for "id"), or name a prefix of it; "" when none
// is.
func nearest(name string, known []string) string {
	limit := 2
	if len(name) <= 4 {
		limit = 1
	}
	best, bestD := "", limit+1
	for _, k := range known {
		d := editDistance(strings.ToLower(name), k)
		if strings.HasPrefix(k, strings.ToLower(name)) && len(name) >= 3 {
			d = min(d, limit)
		}
		if d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
