// Package mp reads msgpack values in place: no reflection, no allocation.
// Each function reads the value at b[i:] in any of the encodings msgpack
// allows for its type and returns it with the offset just past it.
//
// Its place in the architecture: a leaf under events, imported by the
// export file reader (events) and by the projections' fold, the two hot
// paths that read understudy's own records by the million (export files,
// KV values of leader registers and heartbeats). The msgpack library stays
// the definition of every wire form; mp only reads what it writes, and the
// projections test that both agree on every value (TestFastDecodersAgree).
package mp
