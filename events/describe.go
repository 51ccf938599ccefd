package events

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Describe renders an event's exported, non-zero fields as "key=value"
// pairs joined by spaces, keyed by their msgpack names (the field name in
// lower case when it has none), leaving out the fields named in omit (Go
// field names). Times are written in UTC, RFC 3339 with nanoseconds. It is
// for people — timelines, live displays, traces — not a wire form.
func Describe(ev Event, omit ...string) string {
	v := reflect.ValueOf(ev)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return ""
	}
	var b strings.Builder
	t := v.Type()
	for i := range v.NumField() {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() || fv.IsZero() || slices.Contains(omit, f.Name) {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		if name == "" || name == "-" {
			name = strings.ToLower(f.Name)
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		switch x := fv.Interface().(type) {
		case time.Time:
			fmt.Fprintf(&b, "%s=%s", name, x.UTC().Format(time.RFC3339Nano))
		case fmt.Stringer:
			fmt.Fprintf(&b, "%s=%s", name, x.String())
		default:
			if fv.Kind() == reflect.Struct {
				fmt.Fprintf(&b, "%s=%+v", name, x)
			} else {
				fmt.Fprintf(&b, "%s=%v", name, x)
			}
		}
	}
	return b.String()
}
