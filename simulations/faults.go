package simulations

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"understudy/actors/procedure"
)

// FaultKind is one kind of scheduled fault (or operator action).
type FaultKind int

const (
	// FaultPartition drops a node's messages in one or both directions (the
	// connection is broken; the watch resumes from where it was on heal).
	FaultPartition FaultKind = iota + 1
	// FaultStall holds a node's messages and delivers them late, in order,
	// on heal (TCP retransmitting through a cut).
	FaultStall
	// FaultLoss drops requests and replies with a probability; watch
	// deliveries are retransmitted instead (late, in order).
	FaultLoss
	// FaultLatency adds latency to one or both directions.
	FaultLatency
	// FaultCrash kills a process (a node's member and its resource, or the
	// NATS server); it restarts when the fault ends, or never.
	FaultCrash
	// FaultPowerCut is a crash that also loses what was not on the wire:
	// held messages, and on the NATS server acknowledged writes not yet
	// synced (fsync: interval).
	FaultPowerCut
	// FaultPause stops a member process (SIGSTOP) for the duration; its
	// resource's watchdog kills the unit if the pause outlasts it.
	FaultPause
	// FaultJump moves a node's monotonic clock forward.
	FaultJump
	// FaultServerClock bumps the NATS server's clock (forward or back).
	FaultServerClock
	// FaultProc makes a node's procedure steps fail, hang or run slow.
	FaultProc
	// FaultSwitchover is an operator's switchover request to a site.
	FaultSwitchover
	// FaultIsolate cuts a site of the NATS cluster (a site of the pair, with
	// its member and its NATS server, or the witness) off from the other
	// sites. Its member still reaches its local server: a stream leader
	// there keeps proposing what it cannot commit (10164 for a second
	// conditional write to the same subject) and answers reads with what it
	// had; elsewhere requests go nowhere until an election moves the leader.
	FaultIsolate
	// FaultWatchLag makes a site's NATS server apply committed entries late:
	// the member's watch runs Value behind the acknowledgements.
	FaultWatchLag
	// FaultLeader moves the stream leader of the assets to a site (a
	// planned leader transfer; at 0s: where it starts).
	FaultLeader
	// FaultReplCut cuts the replication link of a site's database (database
	// mode only): a standby there stops receiving, a primary there loses
	// its standby, a rejoin through it fails.
	FaultReplCut
	// FaultReplLag keeps a site's standby Bytes behind its primary while it
	// streams (database mode only).
	FaultReplLag
	// FaultForge is an attacker's client writing values of the pair's keys
	// that no member wrote (see Forge). It is not a fault of a member or
	// of NATS: the calm periods and liveness bounds go on, since a forged
	// value must change nothing.
	FaultForge
	// FaultDiskStall stalls the store's disk (Site: nats): the server
	// serves no write while it lasts — KV writes, batches and appends wait
	// and are served in order when it ends — and stays reachable (conn.go).
	FaultDiskStall
)

var faultNames = [...]string{"", "partition", "stall", "loss", "latency", "crash", "powercut", "pause", "jump", "serverclock", "proc", "switchover", "isolate", "watchlag", "leader", "replcut", "repllag", "forge", "diskstall"}

// Forge is what a FaultForge writes. The deployment is secured: the
// runtime verifies the signature of every register value (runtime.ValueTrust),
// so a register value the forger writes reaches the members as Forged —
// unless By names the site whose node key the forger holds (a peer): it is
// then signed by that node, and By is that site — or it re-writes a value
// a member wrote (ForgeReplay), whose signature verifies. Heartbeats are not signed:
// NATS permissions let a node write only its own sites' keys, so the
// forger writes a heartbeat under a key it may write (Key), claiming Site
// in the value.
type Forge int

const (
	// ForgeHandoff writes once leader = none in the current term, naming
	// Site to take over (a clean demotion's release, which the holder did
	// not write).
	ForgeHandoff Forge = iota + 1
	// ForgeBeats writes every heartbeat_timeout a beat of Site: its latest
	// term in the register, the next beat count.
	ForgeBeats
	// ForgeReady writes every heartbeat_timeout, under <pair>.hb.<Key>, a
	// ready follower's heartbeat claiming to be Site's.
	ForgeReady
	// ForgeReplay re-writes every heartbeat_timeout one of the latest
	// register values Site wrote before the fault began (its beats, its
	// acquire, its release), as they were stored, newest first and round
	// again: the signature is Site's node's and verifies, so the values
	// reach the members as genuine. Anyone who may publish on the
	// register's subject can: the pair's other node, or any client that
	// read the key's history.
	ForgeReplay
	// ForgeMsgID publishes every heartbeat_timeout, on a subject of the
	// events stream of its own (forgerSubject), a message under the
	// message id Site's member would give its next event, as far as its
	// latest record tells: JetStream deduplicates ids across the whole
	// stream, so the member's append under that id would be answered
	// "duplicate" and not stored. Anyone who may publish on any subject of
	// the stream (a node, on its agent's trail) and read the member's
	// records can.
	ForgeMsgID
)

var forgeNames = [...]string{"", "handoff", "beats", "ready", "replay", "msgid"}

func (f Forge) String() string {
	if f <= 0 || int(f) >= len(forgeNames) {
		return "unset"
	}
	return forgeNames[f]
}

func (k FaultKind) String() string {
	if k <= 0 || int(k) >= len(faultNames) {
		return "unset"
	}
	return faultNames[k]
}

// Dir is the direction of a link fault, seen from the node.
type Dir int

const (
	DirUp   Dir = iota + 1 // node → NATS
	DirDown                // NATS → node
	DirBoth
)

func (d Dir) String() string {
	switch d {
	case DirUp:
		return "up"
	case DirDown:
		return "down"
	case DirBoth:
		return "both"
	}
	return "unset"
}

func (d Dir) has(x Dir) bool { return d == DirBoth || d == x }

// ProcMode is how a FaultProc makes steps misbehave.
type ProcMode int

const (
	// ProcFail: steps fail quickly (for fence, every step but the last,
	// which by configuration cannot fail).
	ProcFail ProcMode = iota + 1
	// ProcHang: steps hang until their timeout (fence: all but the last).
	ProcHang
	// ProcSlow: steps succeed, close to their timeout.
	ProcSlow
	// ProcFailAll: every step fails, the last fence step too: the chain
	// fails entirely. A fence that cannot fence breaks the configuration's
	// promise; the built-in scenarios use it only where nothing serves.
	ProcFailAll
)

var procModeNames = [...]string{"", "fail", "hang", "slow", "fail-all"}

func (m ProcMode) String() string {
	if m <= 0 || int(m) >= len(procModeNames) {
		return "unset"
	}
	return procModeNames[m]
}

// NATS is the Site of faults on the NATS server (crash, powercut).
const NATS = "nats"

// Witness is the third site of the NATS cluster: it holds a replica of
// every asset (R3) and no member of the pair.
const Witness = "witness"

// Fault is one entry of a fault schedule. At is when it starts (virtual
// time from the start of the run); For is how long it lasts (0: for a
// crash or power cut, for ever; for the instant kinds, nothing).
type Fault struct {
	Kind  FaultKind
	Site  string
	Dir   Dir
	At    time.Duration
	For   time.Duration
	Value time.Duration       // latency added, clock jump or bump
	Loss  int                 // per mille, FaultLoss
	Chain procedure.ChainKind // FaultProc
	Mode  ProcMode            // FaultProc
	Bytes uint64              // FaultReplLag
	// FaultForge: what is forged, the key's site of a forged heartbeat,
	// and the site whose node key signs forged register values ("": none
	// does: they are Forged).
	Forge Forge
	Key   string
	By    string
}

// dbOnly reports whether the fault exists only in database mode.
func (f Fault) dbOnly() bool {
	return f.Kind == FaultReplCut || f.Kind == FaultReplLag || (f.Kind == FaultProc && f.Chain == procedure.ChainRejoin)
}

// instant reports whether the fault happens at one moment (no duration).
func (f Fault) instant() bool {
	switch f.Kind {
	case FaultJump, FaultServerClock, FaultSwitchover, FaultLeader:
		return true
	case FaultForge:
		return f.Forge == ForgeHandoff
	}
	return false
}

// String is the fault in the --faults syntax, e.g. partition(site-a,both)@12.5s+4s.
func (f Fault) String() string {
	var b strings.Builder
	b.WriteString(f.Kind.String())
	args := func(a ...string) {
		b.WriteByte('(')
		b.WriteString(strings.Join(a, ","))
		b.WriteByte(')')
	}
	switch f.Kind {
	case FaultPartition, FaultStall:
		args(f.Site, f.Dir.String())
	case FaultLoss:
		args(f.Site, formatPermille(f.Loss))
	case FaultLatency:
		args(f.Site, f.Dir.String(), f.Value.String())
	case FaultCrash, FaultPowerCut, FaultPause, FaultSwitchover, FaultIsolate, FaultLeader, FaultReplCut, FaultDiskStall:
		args(f.Site)
	case FaultReplLag:
		args(f.Site, formatBytes(f.Bytes))
	case FaultWatchLag:
		args(f.Site, f.Value.String())
	case FaultJump:
		args(f.Site, "+"+f.Value.String())
	case FaultServerClock:
		s := f.Value.String()
		if f.Value >= 0 {
			s = "+" + s
		}
		args(s)
	case FaultProc:
		args(f.Site, f.Chain.String(), f.Mode.String())
	case FaultForge:
		a := []string{f.Forge.String(), f.Site}
		if f.Forge == ForgeReady {
			a = append(a, f.Key)
		}
		if f.By != "" {
			a = append(a, "by="+f.By)
		}
		args(a...)
	}
	b.WriteByte('@')
	b.WriteString(f.At.String())
	if f.For > 0 && !f.instant() {
		b.WriteByte('+')
		b.WriteString(f.For.String())
	}
	return b.String()
}

// formatBytes writes a byte count as the --faults syntax reads it: 2MiB,
// 512KiB or 1000.
func formatBytes(b uint64) string {
	switch {
	case b != 0 && b%(1<<20) == 0:
		return strconv.FormatUint(b>>20, 10) + "MiB"
	case b != 0 && b%(1<<10) == 0:
		return strconv.FormatUint(b>>10, 10) + "KiB"
	}
	return strconv.FormatUint(b, 10)
}

func parseBytes(s string) (uint64, error) {
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "MiB"):
		s, mult = strings.TrimSuffix(s, "MiB"), 1<<20
	case strings.HasSuffix(s, "KiB"):
		s, mult = strings.TrimSuffix(s, "KiB"), 1<<10
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 || v > (1<<40)/mult {
		return 0, fmt.Errorf("want a positive byte count such as 2MiB, 512KiB or 4096")
	}
	return v * mult, nil
}

func formatPermille(p int) string {
	if p%10 == 0 {
		return strconv.Itoa(p/10) + "%"
	}
	return strconv.FormatFloat(float64(p)/10, 'f', 1, 64) + "%"
}

// FormatFaults writes a schedule in the --faults syntax: faults joined by ';'.
func FormatFaults(fs []Fault) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.String()
	}
	return strings.Join(parts, ";")
}

// ParseFaults reads a schedule in the --faults syntax. Sites are the pair's
// site names, or "primary" and "replica" for them; "nats" is the server.
//
//	partition(SITE,up|down|both)@AT+FOR   stall(SITE,DIR)@AT+FOR
//	loss(SITE,PCT%)@AT+FOR                latency(SITE,DIR,DUR)@AT+FOR
//	crash(SITE|nats)@AT[+FOR]             powercut(SITE|nats)@AT[+FOR]
//	pause(SITE)@AT+FOR                    jump(SITE,+DUR)@AT
//	serverclock(±DUR)@AT                  switchover(SITE)@AT
//	proc(SITE,fence|promote|demote,fail|hang|slow|fail-all)@AT+FOR
//	isolate(SITE|witness)@AT+FOR          watchlag(SITE,DUR)@AT+FOR
//	leader(SITE|witness)@AT
//	replcut(SITE)@AT+FOR                  repllag(SITE,BYTES)@AT+FOR
//	proc(SITE,rejoin,fail|hang|slow)@AT+FOR
//	forge(handoff,SITE[,by=SITE])@AT      forge(beats,SITE[,by=SITE])@AT+FOR
//	forge(ready,SITE,KEY)@AT+FOR            forge(replay,SITE)@AT+FOR
//	forge(msgid,SITE)@AT+FOR              diskstall(nats)@AT+FOR
//
// replcut, repllag and rejoin faults need the database mode (db-* scenarios).
//
// AT and FOR are Go durations (12.5s, 1m30s). Without +FOR a crash or
// power cut is permanent. The result is sorted by time.
func ParseFaults(spec, primary, replica string) ([]Fault, error) {
	var out []Fault
	for i, raw := range strings.Split(spec, ";") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		f, err := parseFault(raw, primary, replica)
		if err != nil {
			return nil, fmt.Errorf("fault %d %q: %w", i+1, raw, err)
		}
		out = append(out, f)
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	return out, nil
}

func parseFault(raw, primary, replica string) (Fault, error) {
	var f Fault
	head, when, ok := strings.Cut(raw, "@")
	if !ok {
		return f, fmt.Errorf("missing @TIME")
	}
	name, args := head, ""
	if i := strings.IndexByte(head, '('); i >= 0 {
		if !strings.HasSuffix(head, ")") {
			return f, fmt.Errorf("missing ')'")
		}
		name, args = head[:i], head[i+1:len(head)-1]
	}
	kind := FaultKind(slices.Index(faultNames[:], name))
	if kind <= 0 {
		return f, fmt.Errorf("unknown fault %q (known: %s)", name, strings.Join(faultNames[1:], ", "))
	}
	f.Kind = kind
	at, dur, hasFor := strings.Cut(when, "+")
	var err error
	if f.At, err = parseDur(at); err != nil || f.At < 0 {
		return f, fmt.Errorf("time %q: want a non-negative Go duration such as 12.5s", at)
	}
	if hasFor {
		if f.instant() {
			return f, fmt.Errorf("%s happens at an instant: no +DURATION", name)
		}
		if f.For, err = parseDur(dur); err != nil || f.For <= 0 {
			return f, fmt.Errorf("duration %q: want a positive Go duration such as 4s", dur)
		}
	}
	var a []string
	if args != "" {
		a = strings.Split(args, ",")
		for i := range a {
			a[i] = strings.TrimSpace(a[i])
		}
	}
	want := func(n int, form string) error {
		if len(a) != n {
			return fmt.Errorf("want %s(%s)", name, form)
		}
		return nil
	}
	site := func(s string, natsOK bool) (string, error) {
		switch s {
		case "primary":
			return primary, nil
		case "replica":
			return replica, nil
		case primary, replica:
			return s, nil
		case NATS:
			if natsOK {
				return s, nil
			}
		}
		if s == Witness && (kind == FaultIsolate || kind == FaultLeader) {
			return s, nil
		}
		if kind == FaultIsolate || kind == FaultLeader {
			return "", fmt.Errorf("site %q: want %s, %s or %s", s, primary, replica, Witness)
		}
		if natsOK {
			return "", fmt.Errorf("site %q: want %s, %s or nats", s, primary, replica)
		}
		return "", fmt.Errorf("site %q: want %s or %s", s, primary, replica)
	}
	dir := func(s string) (Dir, error) {
		switch s {
		case "up":
			return DirUp, nil
		case "down":
			return DirDown, nil
		case "both":
			return DirBoth, nil
		}
		return 0, fmt.Errorf("direction %q: want up, down or both", s)
	}
	needFor := func() error {
		if f.For <= 0 {
			return fmt.Errorf("%s needs a duration: %s(...)@AT+FOR", name, name)
		}
		return nil
	}
	switch kind {
	case FaultPartition, FaultStall:
		if err := want(2, "SITE,up|down|both"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		if f.Dir, err = dir(a[1]); err != nil {
			return f, err
		}
		return f, needFor()
	case FaultLoss:
		if err := want(2, "SITE,PCT%"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		p, perr := strconv.ParseFloat(strings.TrimSuffix(a[1], "%"), 64)
		if perr != nil || !strings.HasSuffix(a[1], "%") || p <= 0 || p > 100 {
			return f, fmt.Errorf("loss %q: want a percentage in (0%%, 100%%] such as 5%%", a[1])
		}
		f.Loss, f.Dir = int(p*10+0.5), DirBoth
		return f, needFor()
	case FaultLatency:
		if err := want(3, "SITE,DIR,DURATION"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		if f.Dir, err = dir(a[1]); err != nil {
			return f, err
		}
		if f.Value, err = parseDur(a[2]); err != nil || f.Value <= 0 {
			return f, fmt.Errorf("latency %q: want a positive duration", a[2])
		}
		return f, needFor()
	case FaultCrash, FaultPowerCut:
		if err := want(1, "SITE"); err != nil {
			return f, err
		}
		f.Site, err = site(a[0], true)
		return f, err
	case FaultDiskStall:
		if err := want(1, "nats"); err != nil {
			return f, err
		}
		if a[0] != NATS {
			return f, fmt.Errorf("site %q: the store's disk is the NATS server's: want diskstall(nats)", a[0])
		}
		f.Site = NATS
		return f, needFor()
	case FaultPause:
		if err := want(1, "SITE"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		return f, needFor()
	case FaultSwitchover, FaultLeader:
		if err := want(1, "SITE"); err != nil {
			return f, err
		}
		f.Site, err = site(a[0], false)
		return f, err
	case FaultIsolate, FaultReplCut:
		if err := want(1, "SITE"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		return f, needFor()
	case FaultReplLag:
		if err := want(2, "SITE,BYTES"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		if f.Bytes, err = parseBytes(a[1]); err != nil {
			return f, fmt.Errorf("lag %q: %w", a[1], err)
		}
		return f, needFor()
	case FaultWatchLag:
		if err := want(2, "SITE,DURATION"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		if f.Value, err = parseDur(a[1]); err != nil || f.Value <= 0 {
			return f, fmt.Errorf("watch lag %q: want a positive duration", a[1])
		}
		return f, needFor()
	case FaultJump:
		if err := want(2, "SITE,+DURATION"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		if f.Value, err = parseDur(strings.TrimPrefix(a[1], "+")); err != nil || f.Value <= 0 {
			return f, fmt.Errorf("jump %q: a monotonic clock only jumps forward: want +DURATION", a[1])
		}
		return f, nil
	case FaultServerClock:
		if err := want(1, "±DURATION"); err != nil {
			return f, err
		}
		if f.Value, err = parseDur(strings.TrimPrefix(a[0], "+")); err != nil || f.Value == 0 {
			return f, fmt.Errorf("clock bump %q: want a non-zero duration such as +2s or -1s", a[0])
		}
		return f, nil
	case FaultForge:
		return f, parseForge(&f, a, site)
	case FaultProc:
		if err := want(3, "SITE,fence|promote|demote|rejoin,fail|hang|slow|fail-all"); err != nil {
			return f, err
		}
		if f.Site, err = site(a[0], false); err != nil {
			return f, err
		}
		switch a[1] {
		case "fence":
			f.Chain = procedure.ChainFence
		case "promote":
			f.Chain = procedure.ChainPromote
		case "demote":
			f.Chain = procedure.ChainDemote
		case "rejoin":
			f.Chain = procedure.ChainRejoin
		default:
			return f, fmt.Errorf("chain %q: want fence, promote, demote or rejoin", a[1])
		}
		m := ProcMode(slices.Index(procModeNames[:], a[2]))
		if m <= 0 {
			return f, fmt.Errorf("mode %q: want fail, hang, slow or fail-all", a[2])
		}
		f.Mode = m
		return f, needFor()
	}
	return f, fmt.Errorf("unknown fault %q", name)
}

// parseForge reads the arguments of forge(...): handoff,SITE[,by=SITE],
// beats,SITE[,by=SITE], ready,SITE,KEY, replay,SITE or msgid,SITE.
func parseForge(f *Fault, a []string, site func(string, bool) (string, error)) error {
	form := "forge(handoff,SITE[,by=SITE]), forge(beats,SITE[,by=SITE]), forge(ready,SITE,KEY), forge(replay,SITE) or forge(msgid,SITE)"
	if len(a) < 2 {
		return fmt.Errorf("want %s", form)
	}
	f.Forge = Forge(slices.Index(forgeNames[:], a[0]))
	if f.Forge <= 0 {
		return fmt.Errorf("forged value %q: want handoff, beats, ready, replay or msgid", a[0])
	}
	var err error
	if f.Site, err = site(a[1], false); err != nil {
		return err
	}
	rest := a[2:]
	if f.Forge == ForgeReady {
		if len(rest) != 1 {
			return fmt.Errorf("want forge(ready,SITE,KEY): the heartbeat key's site")
		}
		f.Key = rest[0]
		switch {
		case f.Key == "" || strings.ContainsAny(f.Key, ".*> "):
			return fmt.Errorf("key site %q: want a name such as site-b", f.Key)
		case f.Key == f.Site:
			return fmt.Errorf("key site %q: NATS permissions let only %s's node write %s's heartbeat key: a forger writes under a key it may write, claiming %s in the value", f.Key, f.Site, f.Site, f.Site)
		}
		rest = nil
	}
	if f.Forge == ForgeReplay && len(rest) > 0 {
		return fmt.Errorf("want forge(replay,SITE): a replay re-writes SITE's values with their own signatures, no by=SITE")
	}
	if f.Forge == ForgeMsgID && len(rest) > 0 {
		return fmt.Errorf("want forge(msgid,SITE): event records are not signed, no by=SITE")
	}
	switch {
	case len(rest) > 1:
		return fmt.Errorf("want %s", form)
	case len(rest) == 1:
		by, ok := strings.CutPrefix(rest[0], "by=")
		if !ok {
			return fmt.Errorf("%q: want by=SITE, the site whose node key signs the forged values", rest[0])
		}
		if f.By, err = site(by, false); err != nil {
			return err
		}
	}
	if f.Forge == ForgeHandoff && f.For > 0 {
		return fmt.Errorf("forge(handoff,...) happens at an instant: no +DURATION")
	}
	if f.Forge != ForgeHandoff && f.For <= 0 {
		return fmt.Errorf("forge(%s,...) needs a duration: forge(...)@AT+FOR", f.Forge)
	}
	return nil
}

func parseDur(s string) (time.Duration, error) {
	return time.ParseDuration(strings.TrimSpace(s))
}
