package main

import (
	"fmt"
	"strconv"
	"strings"

	"understudy/projections"
)

// result is one measurement. CPU figures are percent of one core over the
// steady phase; RSS figures are the largest VmRSS sampled in it.
type result struct {
	Rev       string  `json:"rev,omitempty"`
	Mode      string  `json:"mode"` // "unset": no leadership key written
	Pairs     int     `json:"pairs"`
	Topology  string  `json:"topology"`
	Promote   string  `json:"promote"` // exec or none (-promote)
	DurationS float64 `json:"duration_s"`

	// RefusedAtStart: the member nodes that refused to start their
	// members, with their reasons (the capacity check of per-pair
	// leadership); nothing else was measured then.
	RefusedAtStart []string `json:"refused_at_start,omitempty"`

	// TimeToServingS: from site-a's start until every register names it
	// unfenced; -1 when that never happened within -serve-within.
	TimeToServingS float64 `json:"time_to_serving_s"`
	// Serving: pairs whose register names site-a unfenced at the end of
	// the steady phase.
	Serving int `json:"serving"`
	// SpuriousFailovers: pairs whose register changed holder or term
	// during the steady phase (no fault was injected), by the samples
	// and the end; OffAMax: most pairs not served by site-a at a sample.
	SpuriousFailovers int `json:"spurious_failovers"`
	OffAMax           int `json:"off_a_max"`
	// Promotions and fences the events stream recorded in the phase.
	PromotedB             int `json:"promoted_b"`
	PromotedA             int `json:"promoted_a"`
	FencedA               int `json:"fenced_a"`
	HeartbeatFailedEvents int `json:"heartbeat_failed_events"`
	// FailingMembers: members of both nodes whose heartbeat failures
	// gauge was above 0 at the last sample (…Max: at any sample).
	FailingMembers    int `json:"failing_members"`
	FailingMembersMax int `json:"failing_members_max"`
	// DualServingSeen: most pairs whose member served on both nodes in
	// the same sample, by their /metrics.
	DualServingSeen int `json:"dual_serving_seen"`
	MetricsServingA int `json:"metrics_serving_a"`
	MetricsServingB int `json:"metrics_serving_b"`
	// The nodes' own view of the store (binaries since issue 16): samples
	// in which each node said it was degraded, and the worst heartbeat
	// write latency either reported.
	StoreMetrics      bool    `json:"store_metrics"`
	DegradedSamplesA  int     `json:"degraded_samples_a"`
	DegradedSamplesB  int     `json:"degraded_samples_b"`
	WriteLatencyMaxMS float64 `json:"write_latency_max_ms"`

	// The store's writes, from its streams' last sequences.
	KVWritesPerS    float64 `json:"kv_writes_per_s"`
	EventWritesPerS float64 `json:"event_writes_per_s"`

	CPUStore   float64 `json:"cpu_store_pct"` // 0 with the embedded topology: it is in CPUA
	CPUA       float64 `json:"cpu_a_pct"`
	CPUB       float64 `json:"cpu_b_pct"`
	RSSStoreMB float64 `json:"rss_store_mb"`
	RSSAMB     float64 `json:"rss_a_mb"`
	RSSBMB     float64 `json:"rss_b_mb"`
	// Per member node and 1,000 pairs: the mean of site-a and site-b
	// scaled (fixed costs included, so small N reads high).
	CPUPer1000   float64 `json:"cpu_per_1000_pairs_pct"`
	RSSPer1000MB float64 `json:"rss_per_1000_pairs_mb"`
	// The machine: others' CPU in the phase (busy time not ours, percent
	// of one core), all of it as a share of all cores, and the load.
	OthersCPU   float64 `json:"others_cpu_pct"`
	MachineBusy float64 `json:"machine_busy_pct"`
	LoadStart   string  `json:"load_start"`
	LoadEnd     string  `json:"load_end"`
	Samples     int     `json:"samples"`
	// SnapshotErrors: snapshots of the registers the store did not answer
	// within 15 s (skipped; an overloaded store is a result).
	SnapshotErrors int `json:"snapshot_errors"`
	// ScrapeErrors: scrapes of a member node's /metrics that did not
	// answer within 20 s (that sample keeps the previous scrape's figures;
	// a node too busy to answer is a result).
	ScrapeErrors int `json:"scrape_errors"`

	// The kill of site-a (times in ms from the SIGKILL; -1: none).
	Killed      bool    `json:"killed"`
	KillHeldByA int     `json:"kill_held_by_a,omitempty"`
	KillGoalMS  float64 `json:"kill_goal_ms,omitempty"`
	// Register: the first value naming site-b; Serving: site-b's
	// serving_started event; FromBeat: register acquired minus site-a's
	// last write that kept the pair (its beat, or its node liveness).
	KillLastMS           float64 `json:"kill_last_ms,omitempty"`
	KillMedianMS         float64 `json:"kill_median_ms,omitempty"`
	KillServingLastMS    float64 `json:"kill_serving_last_ms,omitempty"`
	KillServingMedianMS  float64 `json:"kill_serving_median_ms,omitempty"`
	KillFromBeatLastMS   float64 `json:"kill_from_beat_last_ms,omitempty"`
	KillFromBeatMedianMS float64 `json:"kill_from_beat_median_ms,omitempty"`
	KillMissing          int     `json:"kill_missing"`     // pairs site-b never acquired
	KillNotServing       int     `json:"kill_not_serving"` // acquired, but no serving_started
	KillMetricsServingB  int     `json:"kill_metrics_serving_b,omitempty"`

	// The replay of every pair's record (as understudy replay).
	Replayed        bool `json:"replayed"`
	SplitBrainPairs int  `json:"split_brain_pairs"`
	// SplitBrain: the first pairs' overlaps as the replay reports them.
	SplitBrain      []splitBrain `json:"split_brain,omitempty"`
	ReplayFailovers int          `json:"replay_failovers"`
	ReplayError     string       `json:"replay_error,omitempty"`

	WarnLinesA  int64 `json:"warn_lines_a"`
	ErrorLinesA int64 `json:"error_lines_a"`
	WarnLinesB  int64 `json:"warn_lines_b"`
	ErrorLinesB int64 `json:"error_lines_b"`
}

// line is the one-line summary: key=value pairs, the keys of
// docs/benchmarks.md.
func (r *result) line() string {
	var b strings.Builder
	kv := func(k string, v any) { fmt.Fprintf(&b, " %s=%v", k, v) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	pct := func(v float64) string { return f(v) + "%" }
	b.WriteString("PAIRS")
	if r.Rev != "" {
		kv("rev", r.Rev)
	}
	kv("mode", r.Mode)
	kv("pairs", r.Pairs)
	kv("topology", r.Topology)
	kv("promote", r.Promote)
	if len(r.RefusedAtStart) > 0 {
		kv("refused_at_start", len(r.RefusedAtStart))
		kv("load", r.LoadStart+"->"+r.LoadEnd)
		return b.String()
	}
	kv("serving", fmt.Sprintf("%d/%d", r.Serving, r.Pairs))
	kv("time_to_serving_s", f(r.TimeToServingS))
	kv("spurious_failovers", r.SpuriousFailovers)
	kv("off_a_max", r.OffAMax)
	kv("promoted_b", r.PromotedB)
	kv("failing_members", r.FailingMembers)
	kv("failing_members_max", r.FailingMembersMax)
	kv("dual_serving_seen", r.DualServingSeen)
	if r.StoreMetrics {
		kv("degraded_samples", fmt.Sprintf("%d+%d/%d", r.DegradedSamplesA, r.DegradedSamplesB, r.Samples))
		kv("write_latency_max_ms", f(r.WriteLatencyMaxMS))
	}
	kv("kv_writes_per_s", f(r.KVWritesPerS))
	kv("event_writes_per_s", f(r.EventWritesPerS))
	if r.Topology == topoStore {
		kv("cpu_store", pct(r.CPUStore))
	} else {
		kv("cpu_store", "in_a")
	}
	kv("cpu_a", pct(r.CPUA))
	kv("cpu_b", pct(r.CPUB))
	if r.Topology == topoStore {
		kv("rss_store_mb", f(r.RSSStoreMB))
	}
	kv("rss_a_mb", f(r.RSSAMB))
	kv("rss_b_mb", f(r.RSSBMB))
	kv("cpu_per_1000_pairs", pct(r.CPUPer1000))
	kv("rss_per_1000_pairs_mb", f(r.RSSPer1000MB))
	if r.Killed {
		kv("kill_last_ms", f(r.KillLastMS))
		kv("kill_median_ms", f(r.KillMedianMS))
		kv("kill_serving_last_ms", f(r.KillServingLastMS))
		kv("kill_from_beat_last_ms", f(r.KillFromBeatLastMS))
		kv("kill_goal_ms", f(r.KillGoalMS))
		kv("kill_missing", fmt.Sprintf("%d/%d", r.KillMissing, r.KillHeldByA))
	}
	switch {
	case r.Replayed:
		kv("split_brain_pairs", r.SplitBrainPairs)
		kv("replay_failovers", r.ReplayFailovers)
	case r.ReplayError != "":
		kv("split_brain_pairs", "unknown(replay_failed)")
	}
	if r.SnapshotErrors > 0 {
		kv("snapshot_errors", r.SnapshotErrors)
	}
	if r.ScrapeErrors > 0 {
		kv("scrape_errors", r.ScrapeErrors)
	}
	kv("others_cpu", pct(r.OthersCPU))
	kv("load", r.LoadStart+"->"+r.LoadEnd)
	return b.String()
}

// splitBrain is one pair's overlaps of two serving members.
type splitBrain struct {
	Pair     string                `json:"pair"`
	Overlaps []projections.Overlap `json:"overlaps"`
}

func splitBrainOf(rep *projections.Report) splitBrain {
	return splitBrain{Pair: rep.Pair, Overlaps: rep.SplitBrain}
}

// describeOverlaps says, for a log line, which tenures overlapped and how
// each of them is known to have ended.
func describeOverlaps(rep *projections.Report) string {
	var parts []string
	for _, o := range rep.SplitBrain {
		var ts []string
		for _, t := range o.Intervals {
			to := "open"
			if t.To != nil {
				to = t.To.Format("15:04:05.000")
			}
			ts = append(ts, fmt.Sprintf("%s term %d %s..%s (%s, %s)", t.Site, t.Term, t.From.Format("15:04:05.000"), to, t.End, t.EndBasis))
		}
		parts = append(parts, fmt.Sprintf("%.0f ms from %s: %s", o.MS, o.From.Format("15:04:05.000"), strings.Join(ts, " and ")))
	}
	return strings.Join(parts, "; ")
}
