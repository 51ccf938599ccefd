package failover

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"understudy/events"
)

var updateFuzzCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite testdata/fuzz/FuzzInputOf from its seeds")

// fuzzKeys are the pair's keys a KV value arrives on, by index.
var fuzzKeys = []string{LeaderKey("pg"), HeartbeatKey("pg", "site-b"), ConfigKey("pg"), SwitchoverKey("pg"), PauseKey("pg"), ManualFailoverKey("pg")}

// FuzzInputOf: whatever bytes are stored under a pair's key, InputOf never
// panics and classifies them by the key's rules (a register always becomes
// an input, corrupt or not; a heartbeat or switchover is an input or an
// error, never both; rules always an input), and a member fed the result
// never panics and never serves from it.
func FuzzInputOf(f *testing.F) {
	f.Fuzz(func(t *testing.T, key uint8, data []byte) {
		k := fuzzKeys[int(key)%len(fuzzKeys)]
		input := bytes.Clone(data)
		in, err := InputOf("pg", events.Entry{Key: k, Value: data, Revision: 9, Time: time.Unix(100, 0).UTC(), Op: events.OpPut})
		if !bytes.Equal(data, input) {
			t.Fatal("InputOf modified its input")
		}
		switch k {
		case LeaderKey("pg"):
			lo, ok := in.(LeaderObserved)
			if !ok || lo.Entry.Corrupt != (err != nil) {
				t.Fatalf("register: %#v %v", in, err)
			}
		case ConfigKey("pg"):
			if _, ok := in.(ConfigObserved); !ok || err != nil {
				t.Fatalf("rules: %#v %v", in, err)
			}
		default:
			if (in == nil) == (err == nil) {
				t.Fatalf("%s: input %#v and error %v", k, in, err)
			}
		}
		if len(data) > MaxValueSize && err == nil {
			if co, ok := in.(ConfigObserved); !ok || co.DecodeErr == "" {
				t.Fatalf("%d bytes accepted", len(data))
			}
		}
		if in == nil {
			return
		}
		m, merr := NewMember("site-a", DefaultRules("pg", "site-a", "site-b"), Options{})
		if merr != nil {
			t.Fatal(merr)
		}
		m.Start(0)
		m.Step(time.Millisecond, Synced{})
		r := m.Step(2*time.Millisecond, in)
		for i := 0; i < 3; i++ {
			r = m.Step(time.Duration(i+2)*time.Second, Tick{})
		}
		if m.Serving() {
			t.Fatalf("serving after %#v (%v)", in, r)
		}
	})
}

// TestFuzzInputOfSeeds writes the seed corpus (go test -run
// TestFuzzInputOfSeeds -update-fuzz-corpus) and checks it is in place.
func TestFuzzInputOfSeeds(t *testing.T) {
	nested := append(bytes.Repeat([]byte{0x91}, 200), 0xc0)
	seeds := []struct {
		name string
		key  uint8
		data []byte
	}{
		{"leader_valid", 0, EncodeLeader(Leader{Site: "site-a", Term: 3, Beat: 7})},
		{"leader_garbage", 0, []byte("not msgpack \xc1")},
		{"leader_nested", 0, nested},
		{"leader_huge_string", 0, append([]byte{0x81, 0xa1, 's', 0xdb, 0x7f, 0xff, 0xff, 0xff}, 'x')},
		{"leader_oversized", 0, append(EncodeLeader(Leader{Site: "site-a"}), make([]byte, MaxValueSize)...)},
		{"heartbeat_valid", 1, EncodeHeartbeat(Heartbeat{Site: "site-b", Beat: 2, Phase: PhaseFollower, Ready: true})},
		{"heartbeat_wrong_types", 1, []byte{0x81, 0xa1, 's', 0x05}},
		{"config_valid", 2, EncodeRules(DefaultRules("pg", "site-a", "site-b"))},
		{"config_garbage", 2, []byte{0xc1}},
		{"switchover_valid", 3, EncodeSwitchover(Switchover{ID: "x", To: "site-b", Requested: time.Unix(5, 0)})},
		{"switchover_nested", 3, nested},
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzInputOf")
	for _, s := range seeds {
		body := fmt.Sprintf("go test fuzz v1\nbyte(%q)\n[]byte(%q)\n", rune(s.key), s.data)
		path := filepath.Join(dir, s.name)
		if *updateFuzzCorpus {
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !strings.EqualFold(string(got), body) {
			t.Errorf("seed %s missing or stale (rerun with -update-fuzz-corpus): %v", s.name, err)
		}
	}
}
