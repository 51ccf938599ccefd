package simulations

import (
	"cmp"
	"slices"
	"time"
)

// Pattern is the heartbeat arrival pattern of a recorded history: what a
// what-if run (understudy replay --what-if) replays under other rules.
// Times are offsets from the start of the record.
type Pattern struct {
	Duration time.Duration
	// Interval is the heartbeat interval the record was written with (its
	// heartbeat_timeout): arrivals are judged against it.
	Interval    time.Duration
	Sites       []SitePattern
	Switchovers []Switch
}

// SitePattern is one site's part of a Pattern.
type SitePattern struct {
	Site string
	// Writes are when the site's writes landed: the register while it held
	// it, its own heartbeat key otherwise.
	Writes []time.Duration
	// Restarts are when its member process started again (a
	// failover.started event after its first).
	Restarts []time.Duration
}

// Switch is an operator's switchover request in the record.
type Switch struct {
	At time.Duration
	To string
}

// Faults turns the pattern into a fault schedule, per site:
//
//   - a restart between two writes: the process crashed half an interval
//     after the earlier write (or halfway to the restart, if sooner) and
//     came back at the restart;
//   - two writes more than 1.5 intervals apart with no restart between:
//     the site was cut off (a two-way partition) from half an interval
//     after the earlier write for the gap less one interval, so the next
//     write lands when it did;
//   - a write more than a tenth of an interval late: the uplink was slow
//     by that much for the interval in which it was sent;
//   - silent from more than 1.5 intervals before the end of the record:
//     the site lost power for good half an interval after its last write.
//
// Operator switchovers are kept. The schedule is an estimate: a
// recorded gap says writes did not land, not whether the member heard
// NATS meanwhile; a restart says the process died, not exactly when.
func (p Pattern) Faults() []Fault {
	iv := p.Interval
	var out []Fault
	for _, sp := range p.Sites {
		ws := slices.Clone(sp.Writes)
		slices.Sort(ws)
		rs := slices.Clone(sp.Restarts)
		slices.Sort(rs)
		for k := 0; k+1 < len(ws); k++ {
			a, b := ws[k], ws[k+1]
			d := b - a
			i, _ := slices.BinarySearch(rs, a+1)
			if i < len(rs) && rs[i] <= b {
				r := rs[i]
				at := min(a+iv/2, a+(r-a)/2)
				out = append(out, Fault{Kind: FaultCrash, Site: sp.Site, At: at, For: max(r-at, time.Millisecond)})
				continue
			}
			switch {
			case d > iv*3/2:
				out = append(out, Fault{Kind: FaultPartition, Site: sp.Site, Dir: DirBoth, At: a + iv/2, For: d - iv})
			case d > iv+iv/10:
				out = append(out, Fault{Kind: FaultLatency, Site: sp.Site, Dir: DirUp, Value: (d - iv).Round(time.Millisecond), At: a + iv/2, For: iv})
			}
		}
		if n := len(ws); n > 0 && p.Duration-ws[n-1] > iv*3/2 {
			out = append(out, Fault{Kind: FaultPowerCut, Site: sp.Site, At: ws[n-1] + iv/2})
		}
	}
	for _, sw := range p.Switchovers {
		out = append(out, Fault{Kind: FaultSwitchover, Site: sw.To, At: sw.At})
	}
	for i := range out {
		out[i].At = out[i].At.Round(time.Millisecond)
		out[i].For = out[i].For.Round(time.Millisecond)
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	return out
}
