package simulations

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// Scenario is a named fault schedule with the counters it must exercise.
type Scenario struct {
	Name     string
	Summary  string
	Duration time.Duration // default simulated time
	Fsync    FsyncMode     // 0: always
	// Schedule generates the faults for a run from its own PRNG stream.
	Schedule func(r *rand.Rand, rules failover.Rules, d time.Duration) []Fault
	// Required are the counters a run must see at least once; Forbidden
	// must stay 0 (they are checked as the scenario-expectation invariant).
	Required  []counterID
	Forbidden []counterID
	// AutoOnly are required only with failback: auto.
	AutoOnly []counterID
	// Database: each node's resource is a replicating database and a
	// writer commits on whatever serves (database.go); the members run
	// with Options{Rejoin, Positions, Synchronizer}. Synchronous, when
	// set, replaces synchronous: off in the rules.
	Database    bool
	Synchronous failover.Synchronous
}

func (sc *Scenario) required(r failover.Rules) [numCounters]bool {
	var out [numCounters]bool
	for _, c := range sc.Required {
		out[c] = true
	}
	if r.Failback == failover.FailbackAuto {
		for _, c := range sc.AutoOnly {
			out[c] = true
		}
	}
	return out
}

// RequiredCounters lists the names of the counters a scenario must exercise
// with rules.
func (sc *Scenario) RequiredCounters(r failover.Rules) []string {
	req := sc.required(r)
	var out []string
	for c := counterID(0); c < numCounters; c++ {
		if req[c] {
			out = append(out, c.String())
		}
	}
	return out
}

// between returns a duration in [lo, hi), rounded to the millisecond so
// that schedules read well.
func between(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo.Round(time.Millisecond)
	}
	return (lo + time.Duration(r.Int64N(int64(hi-lo)))).Round(time.Millisecond)
}

// scenarios is the catalogue, in --list order.
var scenarios = []*Scenario{
	{
		Name: "power-cut", Summary: "the primary loses power for good; the replica takes over within the bound",
		Duration: 2 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			return []Fault{{Kind: FaultPowerCut, Site: rl.Primary, At: between(r, 20*time.Second, 40*time.Second)}}
		},
		Required: []counterID{cFailover, cDeadReplaced, cStoppedBeforeTakeover},
	},
	{
		Name: "flaky-network", Summary: "lossy, jittery links on both sites: isolated lost heartbeats are ridden out",
		Duration: 10 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			var out []Fault
			for _, site := range []string{rl.Primary, rl.Replica} {
				out = append(out, Fault{Kind: FaultLoss, Site: site, Dir: DirBoth, Loss: 20 + r.IntN(31), At: 10 * time.Second, For: d - 20*time.Second})
			}
			for t := between(r, 15*time.Second, 30*time.Second); t < d-10*time.Second; t += between(r, 10*time.Second, 40*time.Second) {
				site := []string{rl.Primary, rl.Replica}[r.IntN(2)]
				dir := []Dir{DirUp, DirDown, DirBoth}[r.IntN(3)]
				out = append(out, Fault{Kind: FaultLatency, Site: site, Dir: dir, Value: between(r, rl.HeartbeatTimeout/4, rl.HeartbeatTimeout*3/4),
					At: t, For: between(r, time.Second, 3*time.Second)})
			}
			return out
		},
		Required: []counterID{cRiddenOut},
	},
	{
		Name: "slow-death", Summary: "the primary's link latency climbs to 5s: it fences itself before the replica promotes",
		Duration: 3 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			at := between(r, 30*time.Second, 40*time.Second)
			return []Fault{{Kind: FaultLatency, Site: rl.Primary, Dir: DirBoth, Value: 5 * time.Second, At: at, For: d - at}}
		},
		Required: []counterID{cSelfFenced, cFailover, cStoppedBeforeTakeover},
	},
	{
		Name: "replica-partition", Summary: "the replica is cut off (both ways, one way, stalled) past failover_timeout, again and again; it never promotes",
		Duration: 6 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			var out []Fault
			fo := rl.FailoverTimeout
			for t := 30 * time.Second; t < d-4*fo; t += between(r, 40*time.Second, 60*time.Second) {
				kind := []FaultKind{FaultPartition, FaultPartition, FaultStall}[r.IntN(3)]
				dir := []Dir{DirBoth, DirUp, DirDown}[r.IntN(3)]
				out = append(out, Fault{Kind: kind, Site: rl.Replica, Dir: dir, At: t, For: between(r, fo*3/2, fo*5/2)})
			}
			return out
		},
		Required:  []counterID{cReplicaCutOff},
		Forbidden: []counterID{cFailover},
	},
	{
		Name: "replica-lag", Summary: "the replica's writes take 2 heartbeats while the primary's stop landing past failover_timeout: the replica's CAS is rejected",
		Duration: 6 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			var out []Fault
			hb, fo := rl.HeartbeatTimeout, rl.FailoverTimeout
			for t := 30 * time.Second; t < d-fo-20*time.Second; t += between(r, 40*time.Second, 50*time.Second) {
				out = append(out,
					Fault{Kind: FaultLatency, Site: rl.Replica, Dir: DirUp, Value: 2 * hb, At: t, For: fo + 10*hb},
					Fault{Kind: FaultPartition, Site: rl.Primary, Dir: DirUp, At: t + 2*hb, For: between(r, fo+hb/5, fo+hb*8/5)})
			}
			return out
		},
		Required: []counterID{cPromotionRejected},
	},
	{
		Name: "late-ack", Summary: "the primary's writes land but always late (1.5 heartbeats): it fences, its own late writes are adopted, the fenced holder is replaced",
		Duration: 3 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			return []Fault{{Kind: FaultLatency, Site: rl.Primary, Dir: DirUp, Value: rl.HeartbeatTimeout * 3 / 2,
				At: between(r, 30*time.Second, 40*time.Second), For: 90 * time.Second}}
		},
		Required: []counterID{cLateAck, cOwnLateWrite, cFencedTakeover},
	},
	{
		Name: "clock-jump", Summary: "monotonic clock jumps on both sites and server clock bumps: at most a false failure, never a takeover",
		Duration: 5 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			hb, fo := rl.HeartbeatTimeout, rl.FailoverTimeout
			// A jump costs a failure only if a write is in flight: a slow
			// uplink keeps one in flight most of the time.
			return []Fault{
				{Kind: FaultLatency, Site: rl.Primary, Dir: DirUp, Value: hb * 6 / 10, At: 20 * time.Second, For: 30 * time.Second},
				{Kind: FaultJump, Site: rl.Primary, Value: between(r, hb*6/5, hb*9/5), At: between(r, 25*time.Second, 28*time.Second)},
				{Kind: FaultJump, Site: rl.Primary, Value: between(r, hb*6/5, hb*9/5), At: between(r, 33*time.Second, 36*time.Second)},
				{Kind: FaultJump, Site: rl.Primary, Value: between(r, hb*6/5, hb*9/5), At: between(r, 41*time.Second, 44*time.Second)},
				{Kind: FaultJump, Site: rl.Primary, Value: between(r, hb*6/5, hb*9/5), At: between(r, 46*time.Second, 48*time.Second)},
				{Kind: FaultJump, Site: rl.Replica, Value: between(r, 3*fo, 6*fo), At: between(r, 60*time.Second, 70*time.Second)},
				{Kind: FaultServerClock, Value: between(r, time.Second, 3*time.Second), At: between(r, 120*time.Second, 130*time.Second)},
				{Kind: FaultServerClock, Value: -between(r, time.Second, 3*time.Second), At: between(r, 180*time.Second, 190*time.Second)},
				{Kind: FaultJump, Site: rl.Primary, Value: between(r, hb/2, 3*hb), At: between(r, 240*time.Second, 250*time.Second)},
			}
		},
		Required:  []counterID{cJumpFalseFailure, cJumpNoPromotion, cServerClockBump},
		Forbidden: []counterID{cFailover},
	},
	{
		Name: "failed-fence", Summary: "fence steps hang and fail (escalation to the next step); a restart's whole fence chain fails and is retried",
		Duration: 5 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			fo := rl.FailoverTimeout
			p := rl.Primary
			return []Fault{
				{Kind: FaultProc, Site: p, Chain: procedure.ChainFence, Mode: ProcHang, At: 20 * time.Second, For: time.Minute},
				{Kind: FaultPartition, Site: p, Dir: DirBoth, At: between(r, 30*time.Second, 35*time.Second), For: between(r, 2*fo, 3*fo)},
				{Kind: FaultSwitchover, Site: p, At: 90 * time.Second},
				{Kind: FaultProc, Site: p, Chain: procedure.ChainFence, Mode: ProcFail, At: 100 * time.Second, For: time.Minute},
				{Kind: FaultPartition, Site: p, Dir: DirBoth, At: between(r, 110*time.Second, 115*time.Second), For: between(r, 2*fo, 3*fo)},
				{Kind: FaultCrash, Site: p, At: 190 * time.Second, For: 2 * time.Second},
				{Kind: FaultProc, Site: p, Chain: procedure.ChainFence, Mode: ProcFailAll, At: 191 * time.Second, For: 2500 * time.Millisecond},
			}
		},
		Required: []counterID{cFenceEscalated, cStepHung, cFenceRetried, cFenceSlow},
	},
	{
		Name: "return-to-normal", Summary: "the primary loses power, the replica takes over, the primary returns and gets leadership back (failback: auto)",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			return []Fault{{Kind: FaultPowerCut, Site: rl.Primary, At: between(r, 30*time.Second, 40*time.Second), For: between(r, 60*time.Second, 90*time.Second)}}
		},
		Required: []counterID{cFailover, cRestartFenced},
		AutoOnly: []counterID{cFailback},
	},
	{
		Name: "switchover", Summary: "an operator moves leadership back and forth; planned moves need no takeover",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			var out []Fault
			to := []string{rl.Replica, rl.Primary}
			for i, t := 0, between(r, 30*time.Second, 40*time.Second); t < d-20*time.Second; i, t = i+1, t+between(r, 50*time.Second, 60*time.Second) {
				out = append(out, Fault{Kind: FaultSwitchover, Site: to[i%2], At: t})
			}
			return out
		},
		Required:  []counterID{cSwitchover},
		Forbidden: []counterID{cFailover},
	},
	{
		Name: "pause", Summary: "member processes are paused (SIGSTOP): short pauses are ridden out, long ones end in a watchdog kill and a fenced restart",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			fo := rl.FailoverTimeout
			wd := max(rl.FenceGrace/5, time.Millisecond)
			return []Fault{
				{Kind: FaultPause, Site: rl.Primary, At: between(r, 30*time.Second, 35*time.Second), For: between(r, wd/4, wd*3/4)},
				{Kind: FaultPause, Site: rl.Primary, At: between(r, 60*time.Second, 65*time.Second), For: between(r, 2*fo, 3*fo)},
				{Kind: FaultPause, Site: rl.Replica, At: between(r, 150*time.Second, 155*time.Second), For: between(r, 2*fo, 3*fo)},
			}
		},
		Required: []counterID{cWatchdogKill, cRestartFenced},
	},
	{
		Name: "nats-outage", Summary: "the NATS server crashes, then loses power (try --fsync interval to see acknowledged writes lost)",
		Duration: 5 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			return []Fault{
				{Kind: FaultCrash, Site: NATS, At: between(r, 30*time.Second, 40*time.Second), For: between(r, 2*time.Second, 10*time.Second)},
				{Kind: FaultPowerCut, Site: NATS, At: between(r, 150*time.Second, 160*time.Second), For: between(r, 5*time.Second, 20*time.Second)},
			}
		},
		Required: []counterID{cNatsOutage},
	},
	{
		Name: "site-isolation", Summary: "sites of the NATS cluster are cut off (a member's site or the witness) with the stream leader placed at random: writes stall until an election, a cut-off leader answers 10164 and stale reads",
		Duration: 6 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			fo := rl.FailoverTimeout
			sites := []string{rl.Primary, rl.Replica, Witness}
			out := []Fault{{Kind: FaultLeader, Site: sites[r.IntN(3)], At: 0}}
			for t := between(r, 20*time.Second, 30*time.Second); t < d-4*fo; t += between(r, 35*time.Second, 50*time.Second) {
				site := sites[[]int{0, 0, 1, 2}[r.IntN(4)]] // the primary's site half the time
				if r.IntN(3) != 0 {
					// Mostly the stream leader is where the cut is.
					out = append(out, Fault{Kind: FaultLeader, Site: site, At: t - time.Second})
				}
				out = append(out, Fault{Kind: FaultIsolate, Site: site, At: t, For: between(r, 2*time.Second, 3*fo)})
			}
			return out
		},
		Required: []counterID{cLeaderElected, cInFlightRefused},
	},
	{
		Name: "witness-loss", Summary: "the witness site, which holds the stream leader, is cut off again and again: every write stalls until an election; the primary may fence itself, but the pair never fails over for it",
		Duration: 6 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			out := []Fault{{Kind: FaultLeader, Site: Witness, At: 0}}
			for t := between(r, 20*time.Second, 30*time.Second); t < d-4*rl.FailoverTimeout; t += between(r, 40*time.Second, 60*time.Second) {
				out = append(out,
					Fault{Kind: FaultIsolate, Site: Witness, At: t, For: between(r, 2*time.Second, 3*rl.FailoverTimeout)},
					Fault{Kind: FaultLeader, Site: Witness, At: t + 3*rl.FailoverTimeout + 5*time.Second}) // the keeper moves it back
			}
			return out
		},
		Required:  []counterID{cLeaderElected},
		Forbidden: []counterID{cFailover},
	},
	{
		Name: "lossy-primary", Summary: "the primary's link has 400ms of latency and 30% loss for 3 minutes: it fences, announces its unfencing in writes whose answers are lost, and the replica must still take over",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			at := between(r, 20*time.Second, 30*time.Second)
			return []Fault{
				{Kind: FaultLatency, Site: rl.Primary, Dir: DirBoth, Value: 400 * time.Millisecond, At: at, For: 3 * time.Minute},
				{Kind: FaultLoss, Site: rl.Primary, Dir: DirBoth, Loss: 300, At: at, For: 3 * time.Minute},
			}
		},
		Required: []counterID{cSelfFenced, cFencedTakeover},
	},
	{
		Name: "failback-watch-lag", Summary: "the primary returns from a power cut with a watch running seconds behind its acknowledged writes: no failback may leave the register vacant",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			at := between(r, 30*time.Second, 40*time.Second)
			back := between(r, 30*time.Second, 45*time.Second)
			return []Fault{
				{Kind: FaultPowerCut, Site: rl.Primary, At: at, For: back},
				{Kind: FaultWatchLag, Site: rl.Primary, Value: between(r, 3*rl.HeartbeatTimeout, 8*rl.HeartbeatTimeout), At: at + back, For: between(r, 40*time.Second, 60*time.Second)},
			}
		},
		Required: []counterID{cFailover, cWatchLagged},
		AutoOnly: []counterID{cFailback},
	},
	{
		Name: "forged-handoff", Summary: "a forger writes leader = none naming the replica while the primary serves, unsigned and then signed with the replica's node key: nobody takes it for a release",
		Duration: 2 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			return []Fault{
				{Kind: FaultForge, Forge: ForgeHandoff, Site: rl.Replica, At: between(r, 20*time.Second, 30*time.Second)},
				{Kind: FaultForge, Forge: ForgeHandoff, Site: rl.Replica, By: rl.Replica, At: between(r, 50*time.Second, 60*time.Second)},
				{Kind: FaultForge, Forge: ForgeHandoff, Site: rl.Primary, At: between(r, 80*time.Second, 90*time.Second)},
			}
		},
		Required:  []counterID{cForgedWritten, cForgedIgnored},
		Forbidden: []counterID{cFailover},
	},
	{
		Name: "forged-beats", Summary: "the primary loses power for good and a forger keeps writing its beats (unsigned, then with the replica's node key): the replica takes over within the bound all the same",
		Duration: 3 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			cut := between(r, 20*time.Second, 30*time.Second)
			from := cut + between(r, 100*time.Millisecond, rl.HeartbeatTimeout)
			return []Fault{
				{Kind: FaultPowerCut, Site: rl.Primary, At: cut},
				{Kind: FaultForge, Forge: ForgeBeats, Site: rl.Primary, At: from, For: 40 * time.Second},
				{Kind: FaultForge, Forge: ForgeBeats, Site: rl.Primary, By: rl.Replica, At: from + 60*time.Second, For: 40 * time.Second},
			}
		},
		Required: []counterID{cFailover, cDeadReplaced, cForgedWritten, cForgedIgnored},
	},
	{
		Name: "forged-ready", Summary: "while the primary is down, a forger writes ready heartbeats claiming to be the primary's under a key it may write: the replica does not fail back to it before it returns",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			cut := between(r, 20*time.Second, 30*time.Second)
			return []Fault{
				{Kind: FaultPowerCut, Site: rl.Primary, At: cut, For: between(r, 60*time.Second, 80*time.Second)},
				{Kind: FaultForge, Forge: ForgeReady, Site: rl.Primary, Key: rl.Replica, At: cut + 2*rl.FailoverTimeout + between(r, 0, 5*time.Second), For: 30 * time.Second},
			}
		},
		Required: []counterID{cFailover, cForgedWritten},
		AutoOnly: []counterID{cFailback},
	},
	{
		Name: "forged-replay", Summary: "a forger replays the primary's older signed values: its release and beats after a switchover to the replica (nobody takes them back to a term the register left), then its beats after it loses power for good (the replica takes over within the bound all the same)",
		Duration: 4 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			away := between(r, 30*time.Second, 40*time.Second)
			back := away + 50*time.Second
			cut := back + 40*time.Second + between(r, 0, 5*time.Second)
			return []Fault{
				{Kind: FaultSwitchover, Site: rl.Replica, At: away},
				{Kind: FaultForge, Forge: ForgeReplay, Site: rl.Primary, At: away + between(r, 8*time.Second, 10*time.Second), For: 20 * time.Second},
				{Kind: FaultSwitchover, Site: rl.Primary, At: back},
				{Kind: FaultPowerCut, Site: rl.Primary, At: cut},
				{Kind: FaultForge, Forge: ForgeReplay, Site: rl.Primary, At: cut + between(r, 100*time.Millisecond, rl.HeartbeatTimeout), For: 40 * time.Second},
			}
		},
		Required:  []counterID{cSwitchover, cFailover, cDeadReplaced, cForgedWritten, cForgedIgnored},
		Forbidden: []counterID{cLostToForger},
	},
	{
		Name: "forged-msgid", Summary: "a forger publishes, on a subject of its own, messages under the id the replica's member would give its next event; the primary loses power for good: the replica takes over and records it all the same",
		Duration: 3 * time.Minute,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			from := between(r, 10*time.Second, 20*time.Second)
			cut := from + between(r, 10*time.Second, 20*time.Second)
			return []Fault{
				{Kind: FaultForge, Forge: ForgeMsgID, Site: rl.Replica, At: from, For: 2 * time.Minute},
				{Kind: FaultPowerCut, Site: rl.Primary, At: cut},
			}
		},
		Required: []counterID{cFailover, cDeadReplaced, cForgedWritten},
	},
	{
		Name: "random", Summary: "a random schedule drawing on every fault kind (what --swarm runs)",
		Duration: time.Hour,
		Schedule: RandomSchedule,
	},
	{
		Name: "forged-random", Summary: "random's schedule plus forgers: forged handoffs, beats and ready heartbeats, unsigned or with a peer's node key",
		Duration: 20 * time.Minute,
		Schedule: forgedRandomSchedule,
	},
	{
		Name: "db-crashed-primary-failback", Summary: "database mode: the primary's node crashes, the replica takes over; the old primary returns with its database down and its rejoin failing for a while: no failback until it streams again (rewound)",
		Duration: 4 * time.Minute, Database: true,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			at := between(r, 30*time.Second, 40*time.Second)
			back := between(r, 20*time.Second, 40*time.Second)
			return []Fault{
				{Kind: FaultCrash, Site: rl.Primary, At: at, For: back},
				{Kind: FaultProc, Site: rl.Primary, Chain: procedure.ChainRejoin, Mode: ProcFail, At: at + back - time.Second, For: between(r, 20*time.Second, 40*time.Second)},
			}
		},
		Required: []counterID{cFailover, cRestartFenced, cDBCloned, cDBRejoinFailed, cDBRewound},
		AutoOnly: []counterID{cFailback, cDBFailbackStreamed},
	},
	{
		Name: "db-lagging-replica", Summary: "database mode: the replica falls behind by twice maximum_lag_on_failover, then the primary loses power: the replica withholds its promotion (no failover); the primary returns and resumes",
		Duration: 4 * time.Minute, Database: true,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			at := between(r, 20*time.Second, 30*time.Second)
			cut := at + between(r, 30*time.Second, 50*time.Second)
			return []Fault{
				{Kind: FaultReplLag, Site: rl.Replica, Bytes: max(2*rl.MaxLagOnFailover, 1<<20), At: at, For: d - at},
				{Kind: FaultPowerCut, Site: rl.Primary, At: cut, For: between(r, 40*time.Second, 80*time.Second)},
			}
		},
		Required:  []counterID{cDBCloned, cDBWithheld, cRestartFenced, cResumed},
		Forbidden: []counterID{cFailover},
	},
	{
		Name: "db-synchronous", Summary: "database mode, synchronous: on: the replica's replication link flaps and members crash at random times; no acknowledged commit may be lost",
		Duration: 6 * time.Minute, Database: true, Synchronous: failover.SyncOn,
		Schedule: func(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
			var out []Fault
			flaps := func(from, to time.Duration) {
				for t := from + between(r, 0, 5*time.Second); t < to; t += between(r, 8*time.Second, 25*time.Second) {
					out = append(out, Fault{Kind: FaultReplCut, Site: rl.Replica, At: t, For: between(r, time.Second, 6*time.Second)})
				}
			}
			// The first crash comes after a quiet stretch: the register
			// says the commits wait, and the replica takes over.
			flaps(15*time.Second, 60*time.Second)
			first := between(r, 80*time.Second, 95*time.Second)
			out = append(out, Fault{Kind: FaultCrash, Site: rl.Primary, At: first, For: between(r, 10*time.Second, 30*time.Second)})
			flaps(first+40*time.Second, d-20*time.Second)
			for t := first + between(r, 60*time.Second, 90*time.Second); t < d-40*time.Second; t += between(r, 60*time.Second, 90*time.Second) {
				site := []string{rl.Primary, rl.Replica}[r.IntN(2)]
				out = append(out, Fault{Kind: FaultCrash, Site: site, At: t, For: between(r, 5*time.Second, 30*time.Second)})
			}
			slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
			return out
		},
		Required: []counterID{cFailover, cDBSyncOn, cDBSyncOff, cDBCommitWaited},
	},
	{
		Name: "db-random", Summary: "database mode: random's schedule plus replication cuts, replication lag and failing rejoins (synchronous as the rules say: off by default)",
		Duration: 20 * time.Minute, Database: true,
		Schedule: dbRandomSchedule,
	},
	{
		Name: "db-random-sync", Summary: "db-random with synchronous: on",
		Duration: 20 * time.Minute, Database: true, Synchronous: failover.SyncOn,
		Schedule: dbRandomSchedule,
	},
}

// dbRandomSchedule is RandomSchedule plus faults of the databases, about
// one a minute: replication cuts, lag (within and beyond the limit) and
// failing, hanging or slow rejoins.
func dbRandomSchedule(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
	out := RandomSchedule(r, rl, d)
	sites := []string{rl.Primary, rl.Replica}
	lim := max(rl.MaxLagOnFailover, 1<<16)
	for t := between(r, 10*time.Second, 60*time.Second); t < d-10*time.Second; t += between(r, 20*time.Second, 100*time.Second) {
		site := sites[r.IntN(2)]
		switch w := r.IntN(9); {
		case w < 4:
			out = append(out, Fault{Kind: FaultReplCut, Site: site, At: t, For: between(r, time.Second, 3*rl.FailoverTimeout)})
		case w < 7:
			b := []uint64{lim / 16, lim / 2, 2 * lim, 8 * lim}[r.IntN(4)]
			out = append(out, Fault{Kind: FaultReplLag, Site: site, Bytes: b, At: t, For: between(r, 5*time.Second, 2*time.Minute)})
		default:
			mode := []ProcMode{ProcFail, ProcHang, ProcSlow}[r.IntN(3)]
			out = append(out, Fault{Kind: FaultProc, Site: site, Chain: procedure.ChainRejoin, Mode: mode, At: t, For: between(r, 10*time.Second, time.Minute)})
		}
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	return out
}

// forgedRandomSchedule is RandomSchedule plus a forger about once a
// minute (drawn after RandomSchedule's faults, so those are random's).
// Signed values are signed with a peer's key: beats with the other site's,
// a handoff with either (the forger skips what the holder may write
// itself). Ready heartbeats claim the preferred primary (only it is failed
// back to) under the replica's key: the primary's own key is its node's
// word, and a key of neither member reaches no member in the runtime
// (the transcript forged_ready.txt has the member ignore one as well).
func forgedRandomSchedule(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
	out := RandomSchedule(r, rl, d)
	sites := []string{rl.Primary, rl.Replica}
	for t := between(r, 10*time.Second, 60*time.Second); t < d-10*time.Second; t += between(r, 20*time.Second, 100*time.Second) {
		i := r.IntN(2)
		site, signed := sites[i], r.IntN(3) == 0
		switch r.IntN(3) {
		case 0:
			f := Fault{Kind: FaultForge, Forge: ForgeHandoff, Site: site, At: t}
			if signed {
				f.By = sites[r.IntN(2)]
			}
			out = append(out, f)
		case 1:
			f := Fault{Kind: FaultForge, Forge: ForgeBeats, Site: site, At: t, For: between(r, 5*time.Second, 90*time.Second)}
			if signed {
				f.By = sites[1-i]
			}
			out = append(out, f)
		default:
			out = append(out, Fault{Kind: FaultForge, Forge: ForgeReady, Site: rl.Primary, Key: rl.Replica, At: t, For: between(r, 5*time.Second, 60*time.Second)})
		}
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	return out
}

// Scenarios returns the catalogue.
func Scenarios() []*Scenario { return scenarios }

// ScenarioByName returns the scenario named name, or nil.
func ScenarioByName(name string) *Scenario {
	for _, sc := range scenarios {
		if sc.Name == name {
			return sc
		}
	}
	return nil
}

// RandomSchedule draws faults of every kind, about one every 30s, with
// durations scaled by the rules. Server clock bumps are left out: a bump
// together with a follower's clock jump defeats both staleness checks at
// once, a double clock fault the algorithm does not claim to survive (the
// clock-jump scenario bumps the server clock alone). Pauses on one site are
// kept apart, so one stall of a process is never stretched by another.
func RandomSchedule(r *rand.Rand, rl failover.Rules, d time.Duration) []Fault {
	hb, fo := rl.HeartbeatTimeout, rl.FailoverTimeout
	sites := []string{rl.Primary, rl.Replica}
	var out []Fault
	var pauseFree [2]time.Duration
	type pick struct {
		w  int
		fn func(t time.Duration, site string) (Fault, bool)
	}
	dir := func() Dir { return []Dir{DirUp, DirDown, DirBoth, DirBoth}[r.IntN(4)] }
	// One crash or power cut in ten is for good — the dead-primary check
	// needs them — but only while the other site lives: with both dead for
	// good nothing is left to fail over, and the rest of the run tests
	// nothing.
	var gone [2]bool
	restart := func(site string, lo, hi time.Duration) time.Duration {
		i := slices.Index(sites, site)
		if r.IntN(10) == 0 && !gone[1-i] {
			gone[i] = true
			return 0 // never
		}
		return between(r, lo, hi)
	}
	picks := []pick{
		{20, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultPartition, Site: site, Dir: dir(), At: t, For: between(r, hb/2, 4*fo)}, true
		}},
		{10, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultStall, Site: site, Dir: dir(), At: t, For: between(r, hb/2, 3*fo)}, true
		}},
		{8, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultLoss, Site: site, Dir: DirBoth, Loss: []int{10, 50, 200, 500}[r.IntN(4)], At: t, For: between(r, 5*time.Second, 90*time.Second)}, true
		}},
		{12, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultLatency, Site: site, Dir: dir(), Value: between(r, hb/10, 3*hb), At: t, For: between(r, 5*time.Second, 60*time.Second)}, true
		}},
		{8, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultCrash, Site: site, At: t, For: restart(site, time.Second, 3*fo)}, true
		}},
		{6, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultPowerCut, Site: site, At: t, For: restart(site, 5*time.Second, 5*fo)}, true
		}},
		{6, func(t time.Duration, site string) (Fault, bool) {
			i := 0
			if site != sites[0] {
				i = 1
			}
			if t < pauseFree[i] {
				return Fault{}, false
			}
			f := Fault{Kind: FaultPause, Site: site, At: t, For: between(r, 10*time.Millisecond, 3*fo)}
			pauseFree[i] = t + f.For + 2*fo
			return f, true
		}},
		{6, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultJump, Site: site, Value: between(r, 100*time.Millisecond, 3*fo), At: t}, true
		}},
		{12, func(t time.Duration, site string) (Fault, bool) {
			chain := []procedure.ChainKind{procedure.ChainFence, procedure.ChainFence, procedure.ChainPromote, procedure.ChainDemote}[r.IntN(4)]
			modes := []ProcMode{ProcFail, ProcHang, ProcSlow}
			if chain != procedure.ChainFence {
				modes = append(modes, ProcFailAll)
			}
			return Fault{Kind: FaultProc, Site: site, Chain: chain, Mode: modes[r.IntN(len(modes))], At: t, For: between(r, 10*time.Second, 90*time.Second)}, true
		}},
		{4, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultSwitchover, Site: site, At: t}, true
		}},
		{3, func(t time.Duration, _ string) (Fault, bool) {
			return Fault{Kind: FaultCrash, Site: NATS, At: t, For: between(r, time.Second, 20*time.Second)}, true
		}},
		{3, func(t time.Duration, _ string) (Fault, bool) {
			return Fault{Kind: FaultPowerCut, Site: NATS, At: t, For: between(r, time.Second, 20*time.Second)}, true
		}},
		{8, func(t time.Duration, site string) (Fault, bool) {
			if r.IntN(3) == 0 {
				site = Witness
			}
			return Fault{Kind: FaultIsolate, Site: site, At: t, For: between(r, hb, 3*fo)}, true
		}},
		{3, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultLeader, Site: []string{rl.Primary, rl.Replica, Witness}[r.IntN(3)], At: t}, true
		}},
		{4, func(t time.Duration, site string) (Fault, bool) {
			return Fault{Kind: FaultWatchLag, Site: site, Value: between(r, hb/2, 8*hb), At: t, For: between(r, 5*time.Second, 60*time.Second)}, true
		}},
	}
	total := 0
	for _, p := range picks {
		total += p.w
	}
	for t := between(r, 5*time.Second, 30*time.Second); t < d-5*time.Second; t += between(r, time.Second, 60*time.Second) {
		site := sites[0]
		if r.IntN(5) >= 3 {
			site = sites[1]
		}
		w := r.IntN(total)
		for _, p := range picks {
			if w < p.w {
				if f, ok := p.fn(t, site); ok {
					out = append(out, f)
				}
				break
			}
			w -= p.w
		}
	}
	return out
}
