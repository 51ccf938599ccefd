package partition

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Oracle event kinds: what a pair member's procedure script appends to its
// site's oracle file when the member runs that chain.
const (
	KindFence   = "fence"
	KindPromote = "promote"
	KindDemote  = "demote"
)

// Event is one line of an oracle file: `<kind> <unix-nanos> <site>`, written
// by the procedure script itself, so it records what the resource was told
// to do and when, on the machine's one wall clock, independently of what
// understudy records in NATS.
type Event struct {
	Kind string
	At   time.Time
	Site string
}

// ParseOracle reads oracle lines. A torn last line (a script killed while
// writing) is an error: the judge must not guess.
func ParseOracle(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("oracle line %d %q: want `<kind> <unix-nanos> <site>`", n, line)
		}
		switch f[0] {
		case KindFence, KindPromote, KindDemote:
		default:
			return nil, fmt.Errorf("oracle line %d %q: unknown kind %q", n, line, f[0])
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("oracle line %d %q: time: %v", n, line, err)
		}
		out = append(out, Event{Kind: f[0], At: time.Unix(0, ns), Site: f[2]})
	}
	return out, sc.Err()
}

// SortEvents orders events by time, then site, in place.
func SortEvents(evs []Event) {
	slices.SortStableFunc(evs, func(a, b Event) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return strings.Compare(a.Site, b.Site)
	})
}

// Interval is a span in which a site served: from its promote line to its
// next fence or demote line. Open is set when the site still served at the
// end of the observation (To is then that end).
type Interval struct {
	Site     string
	From, To time.Time
	Open     bool
}

func (iv Interval) String() string {
	end := "…"
	if !iv.Open {
		end = iv.To.Format("15:04:05.000")
	}
	return fmt.Sprintf("%s serving %s–%s", iv.Site, iv.From.Format("15:04:05.000"), end)
}

// Serving folds time-ordered events into each site's serving intervals up to
// end. A second promote while serving (a promote chain run again) extends the
// interval; a fence or demote while not serving changes nothing.
func Serving(evs []Event, end time.Time) []Interval {
	open := map[string]time.Time{}
	var out []Interval
	for _, e := range evs {
		from, serving := open[e.Site]
		switch e.Kind {
		case KindPromote:
			if !serving {
				open[e.Site] = e.At
			}
		case KindFence, KindDemote:
			if serving {
				out = append(out, Interval{Site: e.Site, From: from, To: e.At})
				delete(open, e.Site)
			}
		}
	}
	for site, from := range open {
		out = append(out, Interval{Site: site, From: from, To: end, Open: true})
	}
	slices.SortFunc(out, func(a, b Interval) int {
		if c := a.From.Compare(b.From); c != 0 {
			return c
		}
		return strings.Compare(a.Site, b.Site)
	})
	return out
}

// Overlap is a time when two sites served at once.
type Overlap struct {
	A, B     Interval
	From, To time.Time
}

func (o Overlap) String() string {
	return fmt.Sprintf("%s and %s overlap for %s (%s / %s)", o.A.Site, o.B.Site, o.To.Sub(o.From), o.A, o.B)
}

// Overlaps lists every pair of intervals of different sites that share a
// moment. Touching intervals (one ends exactly when the other starts) do not
// overlap.
func Overlaps(ivs []Interval) []Overlap {
	var out []Overlap
	for i := range ivs {
		for j := i + 1; j < len(ivs); j++ {
			a, b := ivs[i], ivs[j]
			if a.Site == b.Site {
				continue
			}
			from, to := later(a.From, b.From), earlier(a.To, b.To)
			if from.Before(to) {
				out = append(out, Overlap{A: a, B: b, From: from, To: to})
			}
		}
	}
	return out
}

// Gap is a span in which no site served.
type Gap struct{ From, To time.Time }

// Duration is the gap's length.
func (g Gap) Duration() time.Duration { return g.To.Sub(g.From) }

// Gaps lists the spans within [from, to] in which no site served.
func Gaps(ivs []Interval, from, to time.Time) []Gap {
	var out []Gap
	cursor := from
	for _, iv := range ivs { // sorted by From
		if !iv.To.After(cursor) {
			continue
		}
		if iv.From.After(cursor) {
			end := earlier(iv.From, to)
			if end.After(cursor) {
				out = append(out, Gap{From: cursor, To: end})
			}
		}
		cursor = later(cursor, iv.To)
		if !cursor.Before(to) {
			return out
		}
	}
	if cursor.Before(to) {
		out = append(out, Gap{From: cursor, To: to})
	}
	return out
}

// Longest returns the longest gap (zero when there is none).
func Longest(gaps []Gap) Gap {
	var best Gap
	for _, g := range gaps {
		if g.Duration() > best.Duration() {
			best = g
		}
	}
	return best
}

// ServingAt returns the sites serving at t, sorted.
func ServingAt(ivs []Interval, t time.Time) []string {
	var out []string
	for _, iv := range ivs {
		if !iv.From.After(t) && (t.Before(iv.To) || (iv.Open && !t.After(iv.To))) {
			out = append(out, iv.Site)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// FirstAfter returns the first event of kind at site at or after t.
func FirstAfter(evs []Event, kind, site string, t time.Time) (Event, bool) {
	for _, e := range evs {
		if e.Kind == kind && e.Site == site && !e.At.Before(t) {
			return e, true
		}
	}
	return Event{}, false
}

// LeadershipChanges counts how often the serving site changed over the
// intervals (a site serving again after its own fence is not a change).
func LeadershipChanges(ivs []Interval) int {
	n := 0
	last := ""
	for _, iv := range ivs {
		if last != "" && iv.Site != last {
			n++
		}
		last = iv.Site
	}
	return n
}

// Count counts the events of kind at or after t.
func Count(evs []Event, kind string, t time.Time) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind && !e.At.Before(t) {
			n++
		}
	}
	return n
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
