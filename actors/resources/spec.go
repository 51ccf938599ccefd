package resources

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// specReader reads typed fields out of a Spec, collecting the first error
// as a *SpecError, and refuses fields it was not asked about (done).
type specReader struct {
	kind   string
	prefix string
	spec   Spec
	seen   map[string]bool
	err    error
}

func newSpecReader(kind string, spec Spec) *specReader {
	return &specReader{kind: kind, spec: spec, seen: map[string]bool{}}
}

func (r *specReader) fail(field, rule string) {
	if r.err == nil {
		r.err = &SpecError{Kind: r.kind, Field: r.prefix + field, Rule: rule}
	}
}

func (r *specReader) get(field string) (any, bool) {
	r.seen[field] = true
	v, ok := r.spec[field]
	return v, ok && v != nil
}

func (r *specReader) str(field string, required bool) string {
	v, ok := r.get(field)
	if !ok {
		if required {
			r.fail(field, "required")
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		r.fail(field, fmt.Sprintf("must be a string (got %v)", v))
	}
	return s
}

func (r *specReader) strs(field string) []string {
	v, ok := r.get(field)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		r.fail(field, fmt.Sprintf("must be a list of strings (got %v)", v))
		return nil
	}
	out := make([]string, len(list))
	for i, x := range list {
		s, isStr := x.(string)
		if !isStr {
			r.fail(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("must be a string (got %v)", x))
		}
		out[i] = s
	}
	return out
}

func (r *specReader) strMap(field string) map[string]string {
	v, ok := r.get(field)
	if !ok {
		return nil
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		r.fail(field, fmt.Sprintf("must be a map of strings (got %v)", v))
		return nil
	}
	out := make(map[string]string, len(m))
	for k, x := range m {
		switch s := x.(type) {
		case string:
			out[k] = s
		case int, bool, float64:
			out[k] = fmt.Sprint(s)
		default:
			r.fail(field+"."+k, fmt.Sprintf("must be a string (got %v)", x))
		}
	}
	return out
}

func (r *specReader) duration(field string, def time.Duration) time.Duration {
	v, ok := r.get(field)
	if !ok {
		return def
	}
	var d time.Duration
	var err error
	switch x := v.(type) {
	case string:
		d, err = time.ParseDuration(x)
	case int:
		d = time.Duration(x) * time.Second
	default:
		err = fmt.Errorf("not a duration")
	}
	if err != nil || d <= 0 {
		r.fail(field, fmt.Sprintf("must be a positive duration such as 30s (got %v)", v))
		return def
	}
	return d
}

func (r *specReader) oneOf(field, def string, allowed ...string) string {
	s := r.str(field, false)
	if s == "" {
		return def
	}
	if !slices.Contains(allowed, s) {
		r.fail(field, fmt.Sprintf("must be one of %v (got %s)", allowed, s))
	}
	return s
}

func (r *specReader) list(field string) []Spec {
	v, ok := r.get(field)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		r.fail(field, fmt.Sprintf("must be a list (got %v)", v))
		return nil
	}
	out := make([]Spec, len(list))
	for i, x := range list {
		m, isMap := x.(map[string]any)
		if !isMap {
			r.fail(field+"["+strconv.Itoa(i)+"]", fmt.Sprintf("must be a map (got %v)", x))
			continue
		}
		out[i] = m
	}
	return out
}

// done refuses fields the reader was not asked about.
func (r *specReader) done() error {
	var unknown []string
	for k := range r.spec {
		if !r.seen[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		r.fail(unknown[0], "unknown field")
	}
	return r.err
}

// sub reads a nested spec with a field prefix.
func (r *specReader) sub(prefix string, spec Spec) *specReader {
	return &specReader{kind: r.kind, prefix: r.prefix + prefix, spec: spec, seen: map[string]bool{}}
}
