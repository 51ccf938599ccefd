package runtime

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// nodeWatch is a node's one watch of the failover bucket (leadership:
// node), instead of one per member: it hands each entry of a pair's keys
// to the members of that pair hosted here, and every node's liveness
// record to every member and (its own node's) to the node's liveness
// actor. It keeps what a member's own watch guaranteed: each key's
// revisions once and in order per member (memberActor.feed), Synced then
// Resynced after a fresh watch, a fresh watch when an acknowledged write of
// the node is not delivered within a heartbeat, and direct reads of the
// liveness records meanwhile. It keeps the latest entry of every key, so
// that a member that starts (or restarts) while it runs gets its pair's
// keys at once, without a watch of its own.
type nodeWatch struct {
	kv     events.KV
	trust  *ValueTrust
	node   string
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	// mu is held while an entry is handed over, so that a member that
	// subscribes gets the cache and then what follows, nothing twice. It
	// is not held while members are woken (wakeMembers): a wake of 10,000
	// members took a survivor's watch 0.1–0.2 s each, three in a row as a
	// takeover began, and every write of its store gate (which reads the
	// cache, see storeGate.stale) and the liveness writer's results waited
	// for them: no register was sent for the first half second.
	mu      sync.Mutex
	byPair  map[string]map[string]*memberActor // pair -> actor id -> member
	members map[string]*memberActor            // actor id -> member
	// roster: members as a slice, for wakes outside mu; rebuilt when
	// stale after a subscribe or unsubscribe, never changed in place.
	roster      []*memberActor
	rosterStale bool
	// wake has a member take in the liveness log at its next turn
	// (memberActor.wakeLive; tests replace it).
	wake     func(a *memberActor)
	liveness func(failover.Input)               // the liveness actor's inbox; nil while it does not run
	cache    map[string]map[string]events.Entry // pair -> key -> latest entry
	live     map[string]failover.LivenessEntry  // node -> latest record handed over
	synced   bool                               // a watch delivered its initial values
	session  uint64
	forged   map[string]uint64 // node -> latest revision logged as not genuine
	syncedCh chan struct{}     // closed at the first Synced
	// lives: the liveness records and results the members take in at
	// their next step; resultEpoch: the epoch of the latest result logged.
	lives       liveLog
	resultEpoch uint64
	// probing: a liveness probe was sent to the liveness actor, which has
	// not taken it in yet.
	probing atomic.Bool

	// lag: the node's writes NATS acknowledged (liveness, its members'
	// registers and raises) against what the watch delivered; its limit
	// is the node's heartbeat_timeout.
	lag      watchLag
	bridging atomic.Bool
	done     chan struct{} // closed when run and bridge have returned
}

func newNodeWatch(kv events.KV, trust *ValueTrust, node string, heartbeat time.Duration, log *slog.Logger) *nodeWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &nodeWatch{kv: kv, trust: trust, node: node, log: log.With("component", "node-watch"),
		ctx: ctx, cancel: cancel,
		byPair: map[string]map[string]*memberActor{}, members: map[string]*memberActor{},
		cache: map[string]map[string]events.Entry{}, live: map[string]failover.LivenessEntry{},
		forged: map[string]uint64{}, syncedCh: make(chan struct{}), done: make(chan struct{}),
		wake: (*memberActor).wakeLive}
	w.lag.limit, w.lag.keep = heartbeat, 256
	return w
}

// start begins watching.
func (w *nodeWatch) start() {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); w.run() }()
	go func() { defer wg.Done(); w.bridge() }()
	go func() { wg.Wait(); close(w.done) }()
}

// stop ends the watch and waits for it.
func (w *nodeWatch) stop() {
	w.cancel()
	<-w.done
}

// run watches the bucket, afresh after each failure or lag.
func (w *nodeWatch) run() {
	backoff := 100 * time.Millisecond
	for w.ctx.Err() == nil {
		watcher, err := w.kv.Watch(w.ctx, ">", events.WatchOptions{})
		w.mu.Lock()
		w.session++
		session := w.session
		w.mu.Unlock()
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			w.log.Warn("kv watch of the node failed; watching again", "err", err, "after", backoff)
			select {
			case <-time.After(backoff):
			case <-w.ctx.Done():
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		w.follow(watcher, session)
		_ = watcher.Stop()
	}
}

// follow hands one watch's entries over until it ends or is stuck (see
// memberActor.follow: the same rule, for every write of the node). A
// watch that lags behind the node's acknowledged writes while it still
// delivers is slow, not stuck: the liveness records are read directly
// meanwhile (bridge), and it is replaced only once it has delivered
// nothing for a heartbeat — a fresh watch redelivers every key of the bucket
// (five per pair), which would make a busy node slower still.
func (w *nodeWatch) follow(watcher events.Watcher, session uint64) {
	check := time.NewTicker(w.lag.limit / 2)
	defer check.Stop()
	progress := w.lag.delivered.Load() // delivered revision at the last check
	moved := time.Now()                // when a check last saw it move
	marked := false                    // this watch delivered its initial values
	for {
		select {
		case e, ok := <-watcher.Updates():
			if !ok {
				return
			}
			if e.Revision == 0 {
				marked = true
				w.markSynced()
				if w.bridging.CompareAndSwap(true, false) {
					w.log.Info("kv watch of the node delivers again; direct reads of the liveness records stop")
				}
				continue
			}
			w.lag.sawDelivered(e.Revision)
			w.route(e, session)
		case <-check.C:
			delivered := w.lag.delivered.Load()
			if delivered > progress {
				progress, moved = delivered, time.Now()
			}
			a, lagging := w.lag.peekOldest()
			switch {
			case lagging && time.Since(moved) >= w.lag.limit:
				w.lag.oldestUndelivered() // forgotten: one fresh watch per lagging write
				w.log.Warn("kv watch of the node lags behind acknowledged writes; watching afresh, and reading the liveness records directly meanwhile",
					"acked_revision", a.rev, "delivered_revision", delivered, "acked_ago", time.Since(a.at))
				w.bridging.Store(true)
				return
			case lagging:
				if w.bridging.CompareAndSwap(false, true) {
					w.log.Warn("kv watch of the node delivers, but behind acknowledged writes; reading the liveness records directly until it catches up",
						"acked_revision", a.rev, "delivered_revision", delivered, "acked_ago", time.Since(a.at))
				}
			case marked && w.bridging.Load() && !w.lag.behind():
				w.bridging.Store(false)
				w.log.Info("kv watch of the node caught up; direct reads of the liveness records stop")
			}
		case <-w.ctx.Done():
			return
		}
	}
}

// markSynced tells every member and the liveness actor that the watch
// delivered its initial values (Synced the first time, Resynced after).
func (w *nodeWatch) markSynced() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.members {
		a.inbox.synced(a)
	}
	if w.liveness != nil {
		if w.synced {
			w.liveness(failover.Resynced{})
		} else {
			w.liveness(failover.Synced{})
		}
	}
	if !w.synced {
		w.synced = true
		close(w.syncedCh)
	}
}

// route hands entry e over: a liveness record to everyone, a pair's key
// to that pair's members. session is the watch's (0: a direct read).
func (w *nodeWatch) route(e events.Entry, session uint64) {
	if node := failover.LivenessNode(e.Key); node != "" {
		w.mu.Lock()
		members, all := w.routeLive(node, e)
		w.mu.Unlock()
		w.wakeMembers(members, all)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	pair, _, ok := strings.Cut(e.Key, ".")
	if !ok || pair == failover.LivenessPrefix || pair == failover.DeploymentPrefix {
		return // not a pair's key (a probe of the store, the deployment's leadership)
	}
	keys := w.cache[pair]
	if keys == nil {
		keys = map[string]events.Entry{}
		w.cache[pair] = keys
	}
	if old, ok := keys[e.Key]; ok && old.Revision >= e.Revision {
		return
	}
	keys[e.Key] = e
	for _, a := range w.byPair[pair] {
		a.inbox.entry(a, e, session)
	}
}

// routeLive hands a revision of node's liveness record to every member,
// and to the liveness actor when it is this node's; it returns the
// members to wake once w.mu is released, and whether all of them (see
// wakeMembers). w.mu is held.
func (w *nodeWatch) routeLive(node string, e events.Entry) (members []*memberActor, all bool) {
	if last, ok := w.live[node]; ok && e.Revision <= last.Rev {
		return nil, false
	}
	le, why := livenessEntryOf(node, e, w.trust)
	if why != nil && e.Revision > w.forged[node] {
		w.forged[node] = e.Revision
		w.log.Warn("liveness value not genuine: no member takes it for a beat or a raise", "node", node, "revision", e.Revision,
			"value", le.Value.String(), "by", le.Value.By, "why", why)
	}
	prev, known := w.live[node]
	w.live[node] = le
	in := failover.LivenessObserved{Node: node, Entry: le}
	w.lives.add(in, time.Now())
	if node == w.node && w.liveness != nil {
		w.toLiveness(le)
	}
	return w.memberList(), failover.LivenessUrgent(w.node, in, prev, known, 0)
}

// toLiveness hands the node's own record to its liveness actor. A value
// the node did not write (forged, deleted) comes after the latest genuine
// one of the key's history: the writer carries on that one's epoch (never
// going back to an earlier one) and expects the other's revision. w.mu is
// held.
func (w *nodeWatch) toLiveness(le failover.LivenessEntry) {
	if le.Forged {
		if g, ok := w.genuineLiveBefore(le.Rev); ok {
			w.liveness(failover.LivenessObserved{Node: w.node, Entry: g})
		}
	}
	w.liveness(failover.LivenessObserved{Node: w.node, Entry: le})
}

// genuineLiveBefore reads the latest genuine value of the node's own
// record below rev from its history (false: none, or not readable).
func (w *nodeWatch) genuineLiveBefore(rev uint64) (failover.LivenessEntry, bool) {
	ctx, cancel := context.WithTimeout(w.ctx, 2*time.Second)
	defer cancel()
	hist, err := w.kv.History(ctx, failover.LivenessKey(w.node))
	if err != nil {
		return failover.LivenessEntry{}, false
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if hist[i].Revision >= rev {
			continue
		}
		if le, why := livenessEntryOf(w.node, hist[i], w.trust); why == nil {
			return le, true
		}
	}
	return failover.LivenessEntry{}, false
}

// subscribe makes a (its pair's keys, every liveness record) one of the
// members the watch feeds: at once what the watch delivered so far, and
// Synced when it has synced. A member actor restarted under the same
// actor id replaces its predecessor.
func (w *nodeWatch) subscribe(a *memberActor) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id, pair := a.pid.String(), a.cfg.Rules.Pair
	w.members[id] = a
	w.rosterStale = true
	if w.byPair[pair] == nil {
		w.byPair[pair] = map[string]*memberActor{}
	}
	w.byPair[pair][id] = a
	es := make([]events.Entry, 0, len(w.cache[pair]))
	for _, e := range w.cache[pair] {
		es = append(es, e)
	}
	slices.SortFunc(es, func(x, y events.Entry) int { return cmp.Compare(x.Revision, y.Revision) })
	for _, e := range es {
		a.inbox.entry(a, e, 0) // not contiguous with what the watch delivered before
	}
	for node, le := range w.live {
		a.inbox.input(a, failover.LivenessObserved{Node: node, Entry: le})
	}
	a.liveSeen = w.lives.latest.Load() // the log from here on; what came before, just above
	if w.synced {
		a.inbox.synced(a)
	}
}

// unsubscribe stops feeding a (a no-op when a successor took its place).
func (w *nodeWatch) unsubscribe(a *memberActor) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id, pair := a.pid.String(), a.cfg.Rules.Pair
	if w.members[id] != a {
		return
	}
	delete(w.members, id)
	w.rosterStale = true
	delete(w.byPair[pair], id)
	if len(w.byPair[pair]) == 0 {
		delete(w.byPair, pair)
	}
}

// setLiveness connects the node's liveness actor (nil: disconnects it):
// it gets its own record as the watch shows it, then Synced.
func (w *nodeWatch) setLiveness(fn func(failover.Input)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.liveness = fn
	w.probing.Store(false) // a probe sent to the actor before is lost with it
	if fn == nil {
		return
	}
	if le, ok := w.live[w.node]; ok {
		w.toLiveness(le)
	}
	if w.synced {
		fn(failover.Synced{})
	}
}

// broadcast hands a result of the node's liveness writes to every
// member: logged for their next step, and every member woken when it is
// not a routine beat (a failed write, a new epoch).
func (w *nodeWatch) broadcast(res failover.LivenessResult) {
	w.mu.Lock()
	w.lives.add(res, time.Now())
	urgent := failover.LivenessUrgent(w.node, res, failover.LivenessEntry{}, false, w.resultEpoch)
	if res.Epoch != 0 {
		w.resultEpoch = res.Epoch
	}
	members := w.memberList()
	w.mu.Unlock()
	w.wakeMembers(members, urgent)
}

// probeLiveness asks the node's liveness actor for a write now
// (failover.LivenessProbe): once, however many members ask, until the
// actor has taken it in.
func (w *nodeWatch) probeLiveness() {
	if !w.probing.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	fn := w.liveness
	w.mu.Unlock()
	if fn == nil {
		w.probing.Store(false)
		return
	}
	fn(failover.LivenessProbe{})
}

// wakeMembers has members take in the liveness log now: every member of
// members (all), or those in a phase that acts on their node's liveness
// (see memberActor.prompt). Called without w.mu, after the log gained
// what they are woken for: a member that subscribed meanwhile reads the
// log from where it joined, and one that left is not stepped again.
func (w *nodeWatch) wakeMembers(members []*memberActor, all bool) {
	for _, a := range members {
		if all || a.prompt.Load() {
			w.wake(a)
		}
	}
}

// memberList is the members as a slice the caller may read after
// releasing w.mu. w.mu is held.
func (w *nodeWatch) memberList() []*memberActor {
	if w.rosterStale {
		l := make([]*memberActor, 0, len(w.members))
		for _, a := range w.members {
			l = append(l, a)
		}
		w.roster, w.rosterStale = l, false
	}
	return w.roster
}

// cached returns the latest entry of key the watch delivered.
func (w *nodeWatch) cached(key string) (events.Entry, bool) {
	pair, _, _ := strings.Cut(key, ".")
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.cache[pair][key]
	return e, ok
}

// waitSynced waits until the watch first synced or ctx ends.
func (w *nodeWatch) waitSynced(ctx context.Context) bool {
	select {
	case <-w.syncedCh:
		return true
	case <-ctx.Done():
		return false
	case <-w.ctx.Done():
		return false
	}
}

// acked records a write of the node that NATS acknowledged: the watch must
// deliver it within a heartbeat.
func (w *nodeWatch) acked(rev uint64) { w.lag.ack(rev) }

// bridge reads every known liveness record directly every quarter
// heartbeat while the watch lags, until a fresh watch delivers (see
// memberActor.bridge): with node liveness, the records are what staleness
// is judged on. The registers are not read: they change only with
// leadership, and the fresh watch delivers them. Every round tells the
// members (Resynced) that beats skipped meanwhile were skipped by the
// reading, not by a stall of the store.
func (w *nodeWatch) bridge() {
	every := w.lag.limit / 4
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		}
		if !w.bridging.Load() {
			continue
		}
		w.mu.Lock()
		if w.synced {
			w.lives.add(failover.Resynced{}, time.Now()) // for the members' next step
			if w.liveness != nil {
				w.liveness(failover.Resynced{})
			}
		}
		nodes := make([]string, 0, len(w.live)+1)
		for n := range w.live {
			nodes = append(nodes, n)
		}
		w.mu.Unlock()
		if !slices.Contains(nodes, w.node) {
			nodes = append(nodes, w.node)
		}
		got := make([]events.Entry, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(w.ctx, every)
				defer cancel()
				if e, err := w.kv.Get(ctx, failover.LivenessKey(n)); err == nil {
					got[i] = e
				}
			}()
		}
		wg.Wait()
		for _, e := range got {
			if e.Revision != 0 {
				w.route(e, 0)
			}
		}
	}
}

// memberInbox is what the node's watch hands one member (its pair's keys,
// liveness records and results, Synced), in the order handed over,
// without the watch waiting on the member: handing over a pair's key may
// read the register's history (a value that does not decode, or that is
// not a holder's own, after a fresh watch), which must hold up neither the
// watch, nor the node's other members, nor its liveness writer (whose
// results the watch broadcasts). A pair's key is handed over by a
// goroutine of the member's, started when needed; the rest is sent at once
// unless that goroutine has some of the member's deliveries left, then
// queued behind them. Safe for concurrent use; the zero value is ready.
type memberInbox struct {
	mu    sync.Mutex
	queue []delivery
	busy  bool // a goroutine drains queue
}

// delivery is one hand-over: a pair's key e (Key set, from watch session),
// an input (nil: take in the node's liveness log), or Synced.
type delivery struct {
	e       events.Entry
	session uint64
	in      failover.Input
	synced  bool
}

func (b *memberInbox) entry(a *memberActor, e events.Entry, session uint64) {
	b.put(a, delivery{e: e, session: session})
}

func (b *memberInbox) input(a *memberActor, in failover.Input) { b.put(a, delivery{in: in}) }

func (b *memberInbox) synced(a *memberActor) { b.put(a, delivery{synced: true}) }

func (b *memberInbox) put(a *memberActor, d delivery) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.busy && d.e.Key == "" {
		a.deliver(d) // quick, and nothing of the member's waits: in order
		return
	}
	b.queue = append(b.queue, d)
	if !b.busy {
		b.busy = true
		go b.drain(a)
	}
}

// drain hands the queue over in order until it is empty.
func (b *memberInbox) drain(a *memberActor) {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 || a.ctx.Err() != nil {
			b.queue, b.busy = nil, false
			b.mu.Unlock()
			return
		}
		d := b.queue[0]
		b.queue[0] = delivery{}
		b.queue = b.queue[1:]
		b.mu.Unlock()
		a.deliver(d)
	}
}
