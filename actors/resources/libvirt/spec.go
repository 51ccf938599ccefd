package libvirt

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"understudy/actors/resources"
)

// fields reads typed values out of a resources.Spec, keeps the first
// error as a *resources.SpecError, and refuses fields it was not asked
// about (done). It mirrors the resources package's reader, which is not
// exported.
type fields struct {
	kind   string
	prefix string
	spec   resources.Spec
	seen   map[string]bool
	err    error
}

func newFields(kind string, spec resources.Spec) *fields {
	return &fields{kind: kind, spec: spec, seen: map[string]bool{}}
}

func (f *fields) fail(field, rule string) {
	if f.err == nil {
		f.err = &resources.SpecError{Kind: f.kind, Field: f.prefix + field, Rule: rule}
	}
}

func (f *fields) get(field string) (any, bool) {
	f.seen[field] = true
	v, ok := f.spec[field]
	return v, ok && v != nil
}

func (f *fields) str(field string) string {
	v, ok := f.get(field)
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		f.fail(field, fmt.Sprintf("must be a string (got %v)", v))
	}
	return s
}

func (f *fields) oneOf(field, def string, allowed []string) string {
	s := f.str(field)
	if s == "" {
		return def
	}
	if !slices.Contains(allowed, s) {
		f.fail(field, fmt.Sprintf("must be one of %v (got %s)", allowed, s))
	}
	return s
}

func (f *fields) integer(field string, def int) int {
	v, ok := f.get(field)
	if !ok {
		return def
	}
	n, isInt := v.(int)
	if !isInt {
		f.fail(field, fmt.Sprintf("must be a whole number (got %v)", v))
		return def
	}
	return n
}

func (f *fields) boolean(field string, def bool) bool {
	v, ok := f.get(field)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		f.fail(field, fmt.Sprintf("must be true or false (got %v)", v))
		return def
	}
	return b
}

func (f *fields) strs(field string) []string {
	v, ok := f.get(field)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		f.fail(field, fmt.Sprintf("must be a list of strings (got %v)", v))
		return nil
	}
	out := make([]string, len(list))
	for i, x := range list {
		s, isStr := x.(string)
		if !isStr {
			f.fail(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("must be a string (got %v)", x))
		}
		out[i] = s
	}
	return out
}

func (f *fields) maps(field string) []*fields {
	v, ok := f.get(field)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		f.fail(field, fmt.Sprintf("must be a list (got %v)", v))
		return nil
	}
	out := make([]*fields, 0, len(list))
	for i, x := range list {
		m, isMap := x.(map[string]any)
		if !isMap {
			f.fail(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("must be a map (got %v)", x))
			continue
		}
		out = append(out, f.sub(fmt.Sprintf("%s[%d].", field, i), m))
	}
	return out
}

func (f *fields) object(field string) *fields {
	v, ok := f.get(field)
	if !ok {
		return nil
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		f.fail(field, fmt.Sprintf("must be a map (got %v)", v))
		return nil
	}
	return f.sub(field+".", m)
}

func (f *fields) sub(prefix string, spec resources.Spec) *fields {
	return &fields{kind: f.kind, prefix: f.prefix + prefix, spec: spec, seen: map[string]bool{}}
}

// done refuses fields nobody asked about, and returns the first error.
func (f *fields) done() error {
	var unknown []string
	for k := range f.spec {
		if !f.seen[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		f.fail(unknown[0], "unknown field")
	}
	return f.err
}

// memoryMiB reads a size: a whole number of MiB, or a string such as
// "2GiB", "512MiB", "1TiB" (M, G, T are read as MiB, GiB, TiB).
func (f *fields) memoryMiB(field string) (uint64, bool) {
	v, ok := f.get(field)
	if !ok {
		return 0, false
	}
	bad := func() (uint64, bool) {
		f.fail(field, fmt.Sprintf("must be a size such as 2GiB or 512MiB, or a whole number of MiB (got %v)", v))
		return 0, true
	}
	switch x := v.(type) {
	case int:
		if x <= 0 {
			return bad()
		}
		return uint64(x), true
	case string:
		s := strings.TrimSpace(x)
		i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
		num, unit := s, ""
		if i >= 0 {
			num, unit = s[:i], strings.TrimSpace(s[i:])
		}
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil || n == 0 {
			return bad()
		}
		mult := map[string]uint64{"": 1, "M": 1, "MiB": 1, "G": 1 << 10, "GiB": 1 << 10, "T": 1 << 20, "TiB": 1 << 20}
		m, known := mult[unit]
		if !known || n > (1<<40)/m {
			return bad()
		}
		return n * m, true
	}
	return bad()
}
