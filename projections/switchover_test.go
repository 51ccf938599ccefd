package projections_test

import (
	"bytes"
	"io"
	"math"
	"testing"

	"understudy/events"
	"understudy/projections"
	"understudy/simulations"
)

// A switchover scenario's record replays as handovers of kind switchover,
// one per operator request, alternating between the sites, with no
// failover; each one's read-only gap is the simulator's own outage for it
// (the demote's start to the new holder serving, as the record dates
// them).
func TestSwitchoverHandovers(t *testing.T) {
	var buf bytes.Buffer
	res, err := simulations.Run(simulations.Config{Scenario: "switchover", Seed: 1, Export: &buf})
	if err != nil || res.Failed() {
		t.Fatalf("simulate: %v %+v", err, res.Violations)
	}
	var requests int
	for _, c := range res.Sometimes {
		if c.Name == "switchover" {
			requests = c.Count
		}
	}
	er, err := events.NewExportReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	h := er.Header()
	fold, err := projections.NewFold(projections.Options{Pair: h.Pair, Codec: simulations.NewCodec(), From: h.From, To: h.To})
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := er.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fold.Add(rec)
	}
	r := fold.Report()

	if len(r.Failovers) != 0 || res.Failovers != 0 {
		t.Errorf("planned moves need no takeover: replay %d failovers, simulator %d", len(r.Failovers), res.Failovers)
	}
	var moves []projections.Handover
	for _, ho := range r.Handovers {
		if ho.Kind == "switchover" {
			moves = append(moves, ho)
		}
	}
	if requests < 2 || len(moves) != requests {
		t.Fatalf("%d switchover handovers for %d requests: %+v", len(moves), requests, r.Handovers)
	}
	var demotes []simulations.Outage
	for _, o := range res.Outages {
		if o.Cause == "stop: demote" {
			demotes = append(demotes, o)
		}
	}
	if len(demotes) != len(moves) {
		t.Fatalf("%d demote outages for %d switchovers", len(demotes), len(moves))
	}
	prevTerm := uint64(0)
	for i, ho := range moves {
		from, to := "site-a", "site-b"
		if i%2 == 1 {
			from, to = to, from
		}
		if ho.From != from || ho.To != to || ho.Term <= prevTerm {
			t.Errorf("switchover %d: %s→%s term %d, want %s→%s after term %d", i, ho.From, ho.To, ho.Term, from, to, prevTerm)
		}
		prevTerm = ho.Term
		if ho.RequestedAt == nil || ho.ReleasedAt == nil || ho.PromotedAt == nil || ho.ServingAt == nil || ho.ReadOnlyGapMS == nil {
			t.Fatalf("switchover %d lacks a time: %+v", i, ho)
		}
		if ho.ReleasedAt.Before(*ho.RequestedAt) || ho.PromotedAt.Before(*ho.ReleasedAt) || ho.ServingAt.Before(*ho.PromotedAt) {
			t.Errorf("switchover %d out of order: requested %v, released %v, promoted %v, serving %v", i, ho.RequestedAt, ho.ReleasedAt, ho.PromotedAt, ho.ServingAt)
		}
		o := demotes[i]
		if o.Site != from || o.By != to || math.Abs(*ho.ReadOnlyGapMS-o.MS) > 0.002 {
			t.Errorf("switchover %d: read-only gap %.3f ms, the simulator's outage %s→%s %.3f ms", i, *ho.ReadOnlyGapMS, o.Site, o.By, o.MS)
		}
		if served := ho.ServingAt.Sub(simulations.Epoch).Seconds(); math.Abs(served-o.To) > 1e-6 {
			t.Errorf("switchover %d: serving at %.6fs, the simulator's outage ends at %.6fs", i, served, o.To)
		}
	}
}
