package resources

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SpecReader reads typed fields out of a Spec, keeps the first error as a
// *SpecError naming the field (with the reader's prefix) and the rule, and
// refuses fields it was not asked about (Done). Every kind decodes its
// spec with one: this package's, and those of other packages (libvirt's
// vm and network). A reader is used by one goroutine; it keeps spec.
//
// A field set to null reads as absent. A field of the wrong type reads as
// its zero value (or the default given) and records the error.
type SpecReader struct {
	kind   string
	prefix string
	spec   Spec
	seen   map[string]bool
	err    error
}

// NewSpecReader reads spec, a spec of kind (named in its errors).
func NewSpecReader(kind string, spec Spec) *SpecReader {
	return &SpecReader{kind: kind, spec: spec, seen: map[string]bool{}}
}

// Fail records that field breaks rule, unless an error is recorded
// already.
func (r *SpecReader) Fail(field, rule string) {
	if r.err == nil {
		r.err = &SpecError{Kind: r.kind, Field: r.prefix + field, Rule: rule}
	}
}

// Get returns field's raw value and whether it is set (and not null); it
// marks the field as read.
func (r *SpecReader) Get(field string) (any, bool) {
	r.seen[field] = true
	v, ok := r.spec[field]
	return v, ok && v != nil
}

// Str reads a string; "" when absent (an error when required).
func (r *SpecReader) Str(field string, required bool) string {
	v, ok := r.Get(field)
	if !ok {
		if required {
			r.Fail(field, "required")
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		r.Fail(field, fmt.Sprintf("must be a string (got %v)", v))
	}
	return s
}

// Strs reads a list of strings; nil when absent.
func (r *SpecReader) Strs(field string) []string {
	v, ok := r.Get(field)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		r.Fail(field, fmt.Sprintf("must be a list of strings (got %v)", v))
		return nil
	}
	out := make([]string, len(list))
	for i, x := range list {
		s, isStr := x.(string)
		if !isStr {
			r.Fail(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("must be a string (got %v)", x))
		}
		out[i] = s
	}
	return out
}

// StrMap reads a map of strings (numbers and booleans are taken as their
// text); nil when absent.
func (r *SpecReader) StrMap(field string) map[string]string {
	v, ok := r.Get(field)
	if !ok {
		return nil
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		r.Fail(field, fmt.Sprintf("must be a map of strings (got %v)", v))
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
			r.Fail(field+"."+k, fmt.Sprintf("must be a string (got %v)", x))
		}
	}
	return out
}

// Int reads a whole number; def when absent.
func (r *SpecReader) Int(field string, def int) int {
	v, ok := r.Get(field)
	if !ok {
		return def
	}
	n, isInt := v.(int)
	if !isInt {
		r.Fail(field, fmt.Sprintf("must be a whole number (got %v)", v))
		return def
	}
	return n
}

// Bool reads true or false; def when absent.
func (r *SpecReader) Bool(field string, def bool) bool {
	v, ok := r.Get(field)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		r.Fail(field, fmt.Sprintf("must be true or false (got %v)", v))
		return def
	}
	return b
}

// Duration reads a positive duration ("30s", or a whole number of
// seconds); def when absent.
func (r *SpecReader) Duration(field string, def time.Duration) time.Duration {
	v, ok := r.Get(field)
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
		r.Fail(field, fmt.Sprintf("must be a positive duration such as 30s (got %v)", v))
		return def
	}
	return d
}

// Size reads a number of bytes: a whole number, or a string such as
// "512KiB", "64MiB", "1GiB" (KiB, MiB, GiB, TiB; or plain digits); def
// when absent.
func (r *SpecReader) Size(field string, def int64) int64 {
	v, ok := r.Get(field)
	if !ok {
		return def
	}
	bad := func() int64 {
		r.Fail(field, fmt.Sprintf("must be a size in bytes such as 65536 or 64MiB (got %v)", v))
		return def
	}
	switch x := v.(type) {
	case int:
		if x < 0 {
			return bad()
		}
		return int64(x)
	case string:
		num, unit := x, int64(1)
		for _, u := range []struct {
			suffix string
			n      int64
		}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}} {
			if n, ok := strings.CutSuffix(x, u.suffix); ok {
				num, unit = n, u.n
				break
			}
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 || n > (1<<50)/unit {
			return bad()
		}
		return n * unit
	}
	return bad()
}

// OneOf reads a string that must be one of allowed; def when absent.
func (r *SpecReader) OneOf(field, def string, allowed ...string) string {
	s := r.Str(field, false)
	if s == "" {
		return def
	}
	if !slices.Contains(allowed, s) {
		r.Fail(field, fmt.Sprintf("must be one of %v (got %s)", allowed, s))
	}
	return s
}

// List reads a list of maps; nil when absent. An entry that is not a map
// is an error and reads as a nil Spec.
func (r *SpecReader) List(field string) []Spec {
	v, ok := r.Get(field)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		r.Fail(field, fmt.Sprintf("must be a list (got %v)", v))
		return nil
	}
	out := make([]Spec, len(list))
	for i, x := range list {
		m, isMap := x.(map[string]any)
		if !isMap {
			r.Fail(field+"["+strconv.Itoa(i)+"]", fmt.Sprintf("must be a map (got %v)", x))
			continue
		}
		out[i] = m
	}
	return out
}

// Items reads a list of maps as readers of their own, prefixed
// "field[i]."; nil when absent. Call Done on each.
func (r *SpecReader) Items(field string) []*SpecReader {
	list := r.List(field)
	out := make([]*SpecReader, 0, len(list))
	for i, s := range list {
		if s != nil {
			out = append(out, r.Sub(field+"["+strconv.Itoa(i)+"].", s))
		}
	}
	return out
}

// Object reads a map as a reader of its own, prefixed "field."; nil when
// absent. Call Done on it.
func (r *SpecReader) Object(field string) *SpecReader {
	v, ok := r.Get(field)
	if !ok {
		return nil
	}
	m, isMap := v.(map[string]any)
	if !isMap {
		r.Fail(field, fmt.Sprintf("must be a map (got %v)", v))
		return nil
	}
	return r.Sub(field+".", m)
}

// Sub reads a nested spec; its errors' fields are prefixed with prefix.
// Its errors are its own: the caller returns them (Done).
func (r *SpecReader) Sub(prefix string, spec Spec) *SpecReader {
	return &SpecReader{kind: r.kind, prefix: r.prefix + prefix, spec: spec, seen: map[string]bool{}}
}

// Done refuses fields nobody asked about, and returns the first error.
func (r *SpecReader) Done() error {
	var unknown []string
	for k := range r.spec {
		if !r.seen[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		r.Fail(unknown[0], "unknown field")
	}
	return r.err
}
