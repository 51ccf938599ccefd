package simulations

import (
	"math/rand/v2"
	"testing"
)

// guessableIDs draws the same event part for every message id until a
// duplicate ack has named another's record: the forger's guess (the latest
// record's id at the next position) is then right, as it was for every id
// before ids had a random part per event.
type guessableIDs struct {
	s    *sim
	rand rand.Source
}

func (g guessableIDs) Uint64() uint64 {
	if g.s.counters[cAppendIDTaken] == 0 {
		return 7
	}
	return g.rand.Uint64()
}

// The appender's check of a duplicate ack (the runtime's ownDuplicate):
// a forger that guesses the replica's next id stores a message under it on
// its own subject; the replica's append is answered "duplicate", the record
// the ack names is not its own, and it appends the event again under a new
// id: nothing is lost and no member stops.
func TestForgedMsgIDTakenIsAppendedAgain(t *testing.T) {
	r := runWith(t, Config{Scenario: "forged-msgid", Seed: 1}, func(s *sim) {
		for _, n := range s.nodes {
			n.idRNG = rand.New(guessableIDs{s: s, rand: rand.NewPCG(1, uint64(n.idx))})
		}
	})
	for _, v := range r.Violations {
		t.Errorf("%s at %.3fs: %s", v.Invariant, v.At, v.Detail)
	}
	taken := 0
	for _, c := range r.Sometimes {
		if c.Name == cAppendIDTaken.String() {
			taken = c.Count
		}
	}
	if taken == 0 {
		t.Fatalf("no duplicate ack named another's record (%v): the forger's guess missed", r.Sometimes)
	}
}
