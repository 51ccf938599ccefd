package runtime

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"understudy/events"
)

// DescribeEvent renders an event as "type key=value ...", skipping zero
// fields: for live displays and logs.
func DescribeEvent(ev events.Event) string {
	var b strings.Builder
	b.WriteString(ev.EventType())
	v := reflect.ValueOf(ev)
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return b.String()
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return b.String()
	}
	t := v.Type()
	for i := 0; i < v.NumField(); i++ {
		f := t.Field(i)
		fv := v.Field(i)
		if !f.IsExported() || fv.IsZero() {
			continue
		}
		name := strings.Split(f.Tag.Get("msgpack"), ",")[0]
		if name == "" || name == "-" {
			name = strings.ToLower(f.Name)
		}
		switch x := fv.Interface().(type) {
		case time.Time:
			fmt.Fprintf(&b, " %s=%s", name, x.Format(time.RFC3339Nano))
		case fmt.Stringer:
			fmt.Fprintf(&b, " %s=%s", name, x.String())
		default:
			if fv.Kind() == reflect.Struct {
				fmt.Fprintf(&b, " %s=%+v", name, x)
			} else {
				fmt.Fprintf(&b, " %s=%v", name, x)
			}
		}
	}
	return b.String()
}
