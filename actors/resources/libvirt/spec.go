package libvirt

import (
	"fmt"
	"strconv"
	"strings"

	"understudy/actors/resources"
)

// memoryMiB reads a size field of f: a whole number of MiB, or a string
// such as "2GiB", "512MiB", "1TiB" (M, G, T are read as MiB, GiB, TiB).
// ok is false when the field is absent.
func memoryMiB(f *resources.SpecReader, field string) (mib uint64, ok bool) {
	v, ok := f.Get(field)
	if !ok {
		return 0, false
	}
	bad := func() (uint64, bool) {
		f.Fail(field, fmt.Sprintf("must be a size such as 2GiB or 512MiB, or a whole number of MiB (got %v)", v))
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
