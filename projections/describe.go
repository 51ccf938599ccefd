package projections

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"understudy/events"
)

// describe renders an event's fields as "key=value ...", skipping zero
// fields and the ones every event of a subject repeats (pair, site,
// resource, rules).
func describe(ev events.Event) string {
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
	for i := 0; i < v.NumField(); i++ {
		f := t.Field(i)
		fv := v.Field(i)
		if !f.IsExported() || fv.IsZero() {
			continue
		}
		switch f.Name {
		case "Pair", "Site", "Resource", "Rules":
			continue
		}
		name := strings.Split(f.Tag.Get("msgpack"), ",")[0]
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
