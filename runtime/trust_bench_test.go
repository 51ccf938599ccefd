package runtime

import (
	"testing"

	"understudy/actors/failover"
)

// BenchmarkRegisterValue is what a member pays per register write and per
// register value it reads: unsigned (an unsecured deployment: encode, and
// decode) as the reference, against signed (encode and sign; decode and
// verify) in the same run. docs/benchmarks.md reports the ratio.
func BenchmarkRegisterValue(b *testing.B) {
	_, ta, tb := trustedPair(b, "pg-main")
	l := failover.Leader{Site: "site-a", Term: 7, Beat: 123456, Prev: 4242, Flush: 0x3000060, Timeline: 2, Sync: true}
	b.Run("write/unsigned", func(b *testing.B) {
		for b.Loop() {
			_ = failover.EncodeLeader(l)
		}
	})
	b.Run("write/signed", func(b *testing.B) {
		for b.Loop() {
			if _, err := ta.Sign("pg-main", "site-a", l); err != nil {
				b.Fatal(err)
			}
		}
	})
	plain := failover.EncodeLeader(l)
	signed, err := ta.Sign("pg-main", "site-a", l)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("read/unsigned", func(b *testing.B) {
		for b.Loop() {
			if _, err := failover.DecodeLeader(plain); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read/signed", func(b *testing.B) {
		for b.Loop() {
			v, err := failover.DecodeLeader(signed)
			if err != nil {
				b.Fatal(err)
			}
			if err := tb.Verify("pg-main", signed, v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
