package raftlock

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

var keySeq atomic.Uint64

// key is a name no other test (or run) uses.
func key(t *testing.T) string {
	return fmt.Sprintf("go-test/%s/%d-%d", t.Name(), time.Now().UnixNano(), keySeq.Add(1))
}

func newClient(t *testing.T, endpoints string, opts Options) *Client {
	t.Helper()
	c, err := New(endpoints, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestLockTryLockAndReleaseTwice(t *testing.T) {
	cl := shared(t)
	a := newClient(t, cl.endpoints(), Options{})
	b := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)

	release, err := a.Lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	ok, releaseB, err := b.TryLock(ctx, k)
	if err != nil || ok {
		t.Fatalf("TryLock of a held key: %v %v, want false <nil>", ok, err)
	}
	releaseB() // a no-op, and must not release a's lock
	if d := describe(t, b, k); len(d.Info.Holders) != 1 || len(d.Info.Waiters) != 0 {
		t.Fatalf("after a failed TryLock: %+v, want a's grant alone and no waiter", d)
	}
	release()
	release() // safe twice
	ok, releaseB, err = b.TryLock(ctx, k)
	if err != nil || !ok {
		t.Fatalf("TryLock of a released key: %v %v", ok, err)
	}
	releaseB()
	if d := describe(t, a, k); d.Exists {
		t.Fatalf("after both releases the key still exists: %+v", d)
	}
}

func TestFencesGrowAndAreCheckable(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	g1, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur, err := c.CheckFence(ctx, k, g1.Fence()); err != nil || !cur {
		t.Fatalf("CheckFence of the holder's fence: %v %v", cur, err)
	}
	d := describe(t, c, k)
	if len(d.Info.Holders) != 1 || uint64(d.Info.Holders[0].Fence) != g1.Fence() || uint64(d.Info.Holders[0].SessionID) != g1.SessionID() {
		t.Fatalf("describe %+v, want the guard's session %d and fence %d", d, g1.SessionID(), g1.Fence())
	}
	if err := g1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if cur, err := c.CheckFence(ctx, k, g1.Fence()); err != nil || cur {
		t.Fatalf("CheckFence of a released fence: %v %v, want false", cur, err)
	}
	g2, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Release()
	if g2.Fence() <= g1.Fence() {
		t.Fatalf("second fence %d is not larger than the first %d", g2.Fence(), g1.Fence())
	}
}

func TestWaitersAreGrantedInOrder(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	holder, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   *Guard
		err error
	}
	results := make([]chan result, 2)
	for i := range results {
		results[i] = make(chan result, 1)
		i := i
		go func() {
			g, err := c.Acquire(ctx, k, AcquireOptions{})
			results[i] <- result{g, err}
		}()
		// Queue them one after the other, so the order is known.
		eventually(t, 10*time.Second, fmt.Sprintf("waiter %d queued", i+1), func() bool {
			return len(describe(t, c, k).Info.Waiters) == i+1
		})
	}
	holder.Release()
	first := <-results[0]
	if first.err != nil {
		t.Fatal(first.err)
	}
	select {
	case r := <-results[1]:
		t.Fatalf("the second waiter was granted while the first holds: %+v", r)
	default:
	}
	first.g.Release()
	second := <-results[1]
	if second.err != nil {
		t.Fatal(second.err)
	}
	second.g.Release()
	if !(holder.Fence() < first.g.Fence() && first.g.Fence() < second.g.Fence()) {
		t.Fatalf("fences %d, %d, %d are not increasing", holder.Fence(), first.g.Fence(), second.g.Fence())
	}
}

func TestSharedHoldersTogetherExclusiveWaits(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	r1, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Acquire(ctx, k, AcquireOptions{Shared: true, Try: true})
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := c.Acquire(ctx, k, AcquireOptions{Try: true}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("an exclusive try while readers hold: %v, want ErrNotAcquired", err)
	}
	got := make(chan *Guard, 1)
	go func() {
		g, err := c.Acquire(ctx, k, AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	eventually(t, 10*time.Second, "the writer queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	r1.Release()
	select {
	case <-got:
		t.Fatal("the writer was granted while a reader holds")
	default:
	}
	r2.Release()
	w := <-got
	if w == nil {
		t.FailNow()
	}
	w.Release()
}

func TestCancelledContextWithdrawsTheWait(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	holder, err := c.Acquire(ctxFor(t, 30*time.Second), k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Lock(ctx, k)
		done <- err
	}()
	eventually(t, 10*time.Second, "the waiter queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with a cancelled context: %v, want context.Canceled", err)
	}
	// The node withdraws the wait and closes its session (the ttl, 10 s,
	// plays no part in this).
	eventually(t, 5*time.Second, "the cancelled wait withdrawn", func() bool { return len(describe(t, c, k).Info.Waiters) == 0 })
	holder.Release()
	ok, release, err := c.TryLock(ctxFor(t, 10*time.Second), k)
	if err != nil || !ok {
		t.Fatalf("after the holder released, the key should be free (the cancelled waiter never granted): %v %v", ok, err)
	}
	release()
}

func TestDeadlineIsTheWaitsTimeout(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	holder, err := c.Acquire(ctxFor(t, 30*time.Second), k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	release, err := c.Lock(ctx, k)
	if !errors.Is(err, context.DeadlineExceeded) || release == nil {
		t.Fatalf("Lock past its deadline: %v (release nil: %v), want DeadlineExceeded and a release func", err, release == nil)
	}
	release()
	if d := describe(t, c, k); len(d.Info.Waiters) != 0 || len(d.Info.Holders) != 1 {
		t.Fatalf("after the timed-out wait: %+v, want the holder alone", d)
	}
	// A deadline already passed sends nothing.
	if _, err := c.Lock(ctx, k); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with a passed deadline: %v", err)
	}
}

func TestLockAndDo(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	boom := errors.New("boom")
	var seen uint64
	err := c.LockAndDo(ctx, k, func(ctx context.Context) error {
		g := GuardFrom(ctx)
		if g == nil || g.Key() != k {
			t.Fatalf("GuardFrom in f: %+v", g)
		}
		seen = g.Fence()
		if cur, err := c.CheckFence(ctx, k, g.Fence()); err != nil || !cur {
			t.Fatalf("the fence in f is not current: %v %v", cur, err)
		}
		ran, err := c.TryLockAndDo(ctx, k, func(context.Context) error {
			t.Fatal("TryLockAndDo ran f on a held key")
			return nil
		})
		if ran || err != nil {
			t.Fatalf("TryLockAndDo on a held key: %v %v", ran, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("LockAndDo returned %v, want f's error", err)
	}
	if cur, err := c.CheckFence(ctx, k, seen); err != nil || cur {
		t.Fatalf("after LockAndDo the lock is still held: %v %v", cur, err)
	}
	if GuardFrom(ctx) != nil {
		t.Fatal("GuardFrom outside f")
	}
	ran, err := c.TryLockAndDo(ctx, k, func(ctx context.Context) error { return nil })
	if !ran || err != nil {
		t.Fatalf("TryLockAndDo on a free key: %v %v", ran, err)
	}
}

func TestHeldPastItsTTLWhileRenewed(t *testing.T) {
	cl := shared(t)
	lost := make(chan string, 1)
	c := newClient(t, cl.endpoints(), Options{TTL: MinTTL, OnLost: func(k string, _ uint64) { lost <- k }})
	k := key(t)
	before := time.Now()
	g, err := c.Acquire(ctxFor(t, 10*time.Second), k, AcquireOptions{})
	after := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	// The lease is counted from the send time, for the smaller of the TTL
	// and the grace, less 10 %.
	span := MinTTL
	if DefaultEndOnDisconnect < span {
		span = DefaultEndOnDisconnect
	}
	want := span - span/10
	end := g.LeaseEnd()
	if end.Before(before.Add(want)) || end.After(after.Add(want)) {
		t.Fatalf("lease end %v is not the send time + %v (sent between %v and %v)", end, want, before, after)
	}
	// Three and a half ttls later the grant is still ours.
	hold := time.NewTimer(3500 * time.Millisecond)
	select {
	case k := <-lost:
		t.Fatalf("%s reported lost while renewed", k)
	case <-g.Lost():
		t.Fatal("Lost closed while renewed")
	case <-hold.C:
	}
	// Valid, or about to be again: on a busy machine a renewal round can
	// outlast the grace count (jeopardy) for a moment.
	eventually(t, 10*time.Second, "valid while renewed", g.Valid)
	if !g.LeaseEnd().After(end) {
		t.Fatal("the lease end never moved")
	}
	if cur, err := c.CheckFence(ctxFor(t, 10*time.Second), k, g.Fence()); err != nil || !cur {
		t.Fatalf("the renewed grant is not current: %v %v", cur, err)
	}
}

func TestSessionEndedElsewhereIsReportedLost(t *testing.T) {
	cl := shared(t)
	lost := make(chan uint64, 1)
	c := newClient(t, cl.endpoints(), Options{TTL: 3 * time.Second, OnLost: func(_ string, f uint64) { lost <- f }})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	g, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Someone ends the session (as an operator, or an expiry would).
	if err := c.call(ctx, "locks/Unlock", unlockRequest{SessionID: u64(g.SessionID())}, nil, time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-lost:
		if f != g.Fence() {
			t.Fatalf("OnLost got fence %d, want %d", f, g.Fence())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the next renewal (within ttl/3) did not report the loss")
	}
	<-g.Lost()
	if g.Valid() {
		t.Fatal("valid after the session was found expired")
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatalf("releasing a lost lock: %v, want nil", err)
	}
}

// The seeds' story: a holder paused (SIGSTOP) past its ttl loses the lock
// to a waiter, and on resume sees it lost at once; its work is not
// cancelled.
func TestPausedHolderSeesLostOnResumeAndGoesOn(t *testing.T) {
	cl := shared(t)
	k := key(t)
	ttl := 2 * time.Second
	w := spawn(t, "hold", cl.endpoints(), k, ttl)
	holdLine := w.expect("HOLD fence ", 15*time.Second)
	w.signal(syscall.SIGSTOP)
	c := newClient(t, cl.endpoints(), Options{})
	g, err := c.Acquire(ctxFor(t, 20*time.Second), k, AcquireOptions{})
	if err != nil {
		w.signal(syscall.SIGCONT)
		t.Fatalf("the paused holder's lock was not freed: %v", err)
	}
	defer g.Release()
	var old uint64
	fmt.Sscanf(holdLine, "HOLD fence %d", &old)
	if g.Fence() <= old {
		t.Fatalf("the new holder's fence %d is not larger than the paused one's %d", g.Fence(), old)
	}
	w.signal(syscall.SIGCONT)
	if line := w.expect("LOST", 5*time.Second); line != "LOST valid=false ctx=<nil>" {
		t.Fatalf("on resume the worker printed %q", line)
	}
	if _, err := w.stdin.Write([]byte("after-loss\n")); err != nil {
		t.Fatal(err)
	}
	w.expect("WORK after-loss ctx=<nil>", 5*time.Second)
	// Its release must not touch the new holder's grant.
	w.expect("RELEASED err=<nil>", 10*time.Second)
	if cur, err := c.CheckFence(ctxFor(t, 10*time.Second), k, g.Fence()); err != nil || !cur {
		t.Fatalf("the old holder's release touched the new grant: %v %v", cur, err)
	}
}

// A waiter process killed while queued leaves nothing queued: its
// connection closes and the node withdraws the wait and closes its
// session, long before its 60 s ttl.
func TestKilledWaiterLeavesNothingQueued(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	holder, err := c.Acquire(ctxFor(t, 30*time.Second), k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := spawn(t, "wait", cl.endpoints(), k, 60*time.Second)
	w.expect("WAITING", 15*time.Second)
	eventually(t, 10*time.Second, "the worker queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	w.signal(syscall.SIGKILL)
	eventually(t, 10*time.Second, "the killed worker's wait withdrawn", func() bool { return len(describe(t, c, k).Info.Waiters) == 0 })
	next := make(chan *Guard, 1)
	go func() {
		g, err := c.Acquire(ctxFor(t, 20*time.Second), k, AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		next <- g
	}()
	eventually(t, 10*time.Second, "the next waiter queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	holder.Release()
	g := <-next
	if g == nil {
		t.FailNow()
	}
	g.Release()
}

// A holder process killed (SIGKILL) at the client's defaults (grace
// DefaultEndOnDisconnect) with a TTL of 30 s, while another process (this
// one) waits for the key: its keep-alive stream's connection closes, and
// the waiter gets the lock about a grace later, not a TTL later. Three
// rounds; each kill-to-grant time and the median are printed; the bound
// asserted is behavioural (well under the TTL), not the figure.
func TestKilledHolderFreedWithinItsGrace(t *testing.T) {
	cl := shared(t)
	ttl := 30 * time.Second
	c := newClient(t, cl.endpoints(), Options{})
	var took []time.Duration
	for round := 0; round < 3; round++ {
		k := key(t) + fmt.Sprint(round)
		w := spawnWith(t, "hold", cl.endpoints(), k, ttl, 0, "RAFTLOCK_SAY_RENEWED=1")
		w.expect("HOLD fence ", 15*time.Second)
		// Renewed over the stream: the Lock call's own end is past.
		w.expect("RENEWED", 15*time.Second)
		type granted struct {
			g  *Guard
			at time.Time
		}
		next := make(chan granted, 1)
		go func() {
			g, err := c.Acquire(ctxFor(t, ttl), k, AcquireOptions{})
			if err != nil {
				t.Errorf("round %d: the waiter: %v", round, err)
			}
			next <- granted{g, time.Now()}
		}()
		eventually(t, 10*time.Second, "the waiter queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
		w.signal(syscall.SIGKILL)
		killed := time.Now()
		got := <-next
		if got.g == nil {
			t.FailNow()
		}
		d := got.at.Sub(killed)
		got.g.Release()
		if d >= 10*time.Second {
			t.Fatalf("round %d: the killed holder's lock was granted %v after the kill, want well under its ttl %v", round, d, ttl)
		}
		t.Logf("round %d: kill to grant %v", round, d.Round(time.Millisecond))
		took = append(took, d)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("killed holder (ttl %v, grace %v): next grant %v after the kill (median of %v)", ttl, DefaultEndOnDisconnect, took[1].Round(time.Millisecond), took)
}

// A waiter process killed (SIGKILL) while queued, with another process
// queued behind it, and the holder releasing right after the kill: the
// dead waiter's place passes on (its session ends a grace after its
// stream closes, granted or not), and the one behind it gets the lock long
// before the dead waiter's 60 s ttl (asserted: under 10 s). Three rounds;
// each kill-to-grant time and the median are printed.
func TestAKilledWaitersPlacePassesOn(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	var took []time.Duration
	for round := 0; round < 3; round++ {
		k := key(t) + fmt.Sprint(round)
		holder, err := c.Acquire(ctxFor(t, 30*time.Second), k, AcquireOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dead := spawn(t, "wait", cl.endpoints(), k, 60*time.Second)
		dead.expect("WAITING", 15*time.Second)
		eventually(t, 10*time.Second, "the doomed waiter queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
		live := spawn(t, "wait", cl.endpoints(), k, 60*time.Second)
		live.expect("WAITING", 15*time.Second)
		eventually(t, 10*time.Second, "the live waiter queued behind it", func() bool { return len(describe(t, c, k).Info.Waiters) == 2 })
		dead.signal(syscall.SIGKILL)
		killed := time.Now()
		holder.Release()
		live.expect("HOLD", 20*time.Second)
		d := time.Since(killed)
		if d >= 10*time.Second {
			t.Fatalf("round %d: the waiter behind the killed one was granted %v after the kill", round, d)
		}
		t.Logf("round %d: kill to the next waiter's grant %v", round, d.Round(time.Millisecond))
		took = append(took, d)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("killed waiter (ttl 60s, grace %v, holder released at once): the waiter behind it granted %v after the kill (median of %v)", DefaultEndOnDisconnect, took[1].Round(time.Millisecond), took)
}

// With EndOnDisconnect off, a killed holder holds the lock until its
// session's ttl runs out, then the next waiter gets it.
func TestKilledHolderFreedByItsTTL(t *testing.T) {
	cl := shared(t)
	k := key(t)
	ttl := 2 * time.Second
	w := spawnWith(t, "hold", cl.endpoints(), k, ttl, -1)
	w.expect("HOLD fence ", 15*time.Second)
	w.signal(syscall.SIGKILL)
	killed := time.Now()
	c := newClient(t, cl.endpoints(), Options{})
	g, err := c.Acquire(ctxFor(t, 20*time.Second), k, AcquireOptions{})
	if err != nil {
		t.Fatalf("the killed holder's lock was not freed: %v", err)
	}
	t.Logf("granted %v after the holder was killed (ttl %v)", time.Since(killed).Round(time.Millisecond), ttl)
	g.Release()
}

func TestFollowsTheLeaderPastDeadAndFollowerNodes(t *testing.T) {
	cl := shared(t)
	leader, err := cl.waitLeader(10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	var followers []string
	for _, n := range cl.nodes {
		if n != leader {
			followers = append(followers, n.addr)
		}
	}
	dead, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	// A node that refuses connections, then followers only: the
	// followers' answers name the leader.
	eps := fmt.Sprintf("127.0.0.1:%d,%s", dead[0], strings.Join(followers, ","))
	c := newClient(t, eps, Options{})
	ok, release, err := c.TryLock(ctxFor(t, 20*time.Second), key(t))
	if err != nil || !ok {
		t.Fatalf("through a dead node and followers: %v %v", ok, err)
	}
	release()
	if got := c.currentLeader(); got != "http://"+leader.addr {
		t.Fatalf("the client's leader is %q, want %q", got, leader.addr)
	}
}

func TestNoNodeAnswersGivesUpNamingTheNodes(t *testing.T) {
	dead, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	eps := fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", dead[0], dead[1])
	c := newClient(t, eps, Options{RetryTimeout: 500 * time.Millisecond})
	ok, release, err := c.TryLock(ctxFor(t, 20*time.Second), key(t))
	if ok || release == nil || !IsCode(err, "UNAVAILABLE") {
		t.Fatalf("with no node up: %v %v, want UNAVAILABLE", ok, err)
	}
	for _, p := range dead {
		if !strings.Contains(err.Error(), fmt.Sprintf("127.0.0.1:%d: ", p)) || !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("the error does not name node %d and its error: %v", p, err)
		}
	}
	release()
}

func TestBadInputIsRefusedClearly(t *testing.T) {
	for _, eps := range []string{"", " , ", "ftp://127.0.0.1:1", "127.0.0.1", "http://127.0.0.1:1/path", "http://u:p@127.0.0.1:1"} {
		if _, err := New(eps, Options{}); err == nil {
			t.Errorf("New(%q) accepted", eps)
		}
	}
	for _, ttl := range []time.Duration{MinTTL - time.Millisecond, MaxTTL + time.Millisecond, 1500 * time.Microsecond, -time.Second} {
		if _, err := New("127.0.0.1:1", Options{TTL: ttl}); err == nil || !strings.Contains(err.Error(), "TTL") {
			t.Errorf("TTL %v: %v, want a TTL error", ttl, err)
		}
	}
	for _, ttl := range []time.Duration{MinTTL, MaxTTL} {
		if _, err := New("127.0.0.1:1", Options{TTL: ttl}); err != nil {
			t.Errorf("TTL %v refused: %v", ttl, err)
		}
	}
	if _, err := New("127.0.0.1:1", Options{HTTPClient: &http.Client{Timeout: time.Second}}); err == nil {
		t.Error("an HTTP client with a Timeout was accepted")
	}

	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	ctx := ctxFor(t, 20*time.Second)
	longest := strings.Repeat("k", MaxKeyBytes-len("go-test/")) // MaxKeyBytes in all
	g, err := c.Acquire(ctx, "go-test/"+longest, AcquireOptions{Try: true})
	if err != nil {
		t.Fatalf("a key of MaxKeyBytes: %v", err)
	}
	g.Release()
	for _, k := range []string{"", "go-test/" + longest + "k", "go-test/\xff"} {
		release, err := c.Lock(ctx, k)
		if err == nil || release == nil || !strings.Contains(err.Error(), "bytes of UTF-8") {
			t.Errorf("key %q: %v", k, err)
		}
	}
	if _, err := c.Acquire(ctx, key(t), AcquireOptions{TTL: MaxTTL + time.Millisecond}); err == nil {
		t.Error("Acquire with a TTL past MaxTTL accepted")
	}
	// The node's own refusal comes back as an *Error with its code.
	err = c.call(ctx, "locks/Lock", lockRequest{Name: key(t), TTLMs: 999, Nonce: 1}, nil, time.Second)
	var e *Error
	if !errors.As(err, &e) || e.Code != "INVALID_ARGUMENT" || e.HTTPStatus != 400 {
		t.Fatalf("a ttl the node refuses: %v, want INVALID_ARGUMENT (400)", err)
	}
}

// A wait whose session ends under it (here an Unlock from elsewhere; in
// life, the node closing the session of an attempt whose connection
// broke) is answered "not acquired": Lock waits again in a new session,
// and is granted when the key frees.
func TestAWaitWithdrawnUnderItWaitsAgain(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	holder, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var g *Guard
	go func() {
		var err error
		g, err = c.Acquire(ctx, k, AcquireOptions{})
		got <- err
	}()
	var first uint64
	eventually(t, 10*time.Second, "the waiter queued", func() bool {
		w := describe(t, c, k).Info.Waiters
		if len(w) == 1 {
			first = uint64(w[0].SessionID)
		}
		return len(w) == 1
	})
	if err := c.call(ctx, "locks/Unlock", unlockRequest{SessionID: u64(first)}, nil, time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the waiter queued again, in a new session", func() bool {
		w := describe(t, c, k).Info.Waiters
		return len(w) == 1 && uint64(w[0].SessionID) != first
	})
	holder.Release()
	if err := <-got; err != nil {
		t.Fatalf("the re-queued wait: %v", err)
	}
	defer g.Release()
	if g.SessionID() == first || g.Fence() <= holder.Fence() {
		t.Fatalf("granted in session %d (first %d) with fence %d (holder's %d)", g.SessionID(), first, g.Fence(), holder.Fence())
	}
}

// The leader dies (SIGKILL) while one client holds a lock and another
// waits for it: the holder's renewals follow the new leader and it keeps
// the lock past several TTLs; the waiter's request breaks, its retry
// (same nonce) finds its wait on the new leader, and it is granted when
// the holder releases.
func TestLeaderKilledWhileHoldingAndWaiting(t *testing.T) {
	cl, err := startCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.stop()
	lost := make(chan string, 2)
	c := newClient(t, cl.endpoints(), Options{TTL: 4 * time.Second, OnLost: func(k string, _ uint64) { lost <- k }})
	k := key(t)
	ctx := ctxFor(t, 60*time.Second)
	holder, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan *Guard, 1)
	go func() {
		g, err := c.Acquire(ctx, k, AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		waited <- g
	}()
	eventually(t, 10*time.Second, "the waiter queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	old, err := cl.waitLeader(10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	cl.kill(old)
	if _, err := cl.waitLeader(30*time.Second, old.id); err != nil {
		t.Fatal(err)
	}
	// More than two TTLs on the new leader.
	held := time.NewTimer(9 * time.Second)
	select {
	case k := <-lost:
		t.Fatalf("%s reported lost across the failover", k)
	case <-holder.Lost():
		t.Fatal("the holder's Lost closed across the failover")
	case g := <-waited:
		t.Fatalf("the waiter was granted while the holder holds: %+v", g)
	case <-held.C:
	}
	// Held again once a renewal got through (a busy machine may hold it in
	// jeopardy for a moment).
	eventually(t, 10*time.Second, "the holder valid after the failover", holder.Valid)
	if cur, err := c.CheckFence(ctx, k, holder.Fence()); err != nil || !cur {
		t.Fatalf("after the failover the holder's fence is current %v (%v)", cur, err)
	}
	d := describe(t, c, k)
	if len(d.Info.Waiters) != 1 {
		t.Fatalf("after the failover the queue is %+v, want the one waiter", d)
	}
	holder.Release()
	g := <-waited
	if g == nil {
		t.FailNow()
	}
	if g.Fence() <= holder.Fence() {
		t.Fatalf("the waiter's fence %d is not larger than the holder's %d", g.Fence(), holder.Fence())
	}
	// It waited more than two TTLs: the grant is held (a renewal right
	// after it), not lost.
	eventually(t, 10*time.Second, "the waiter valid after its long wait", func() bool {
		if lostClosed(g) {
			t.Fatalf("the waiter's Lost closed right after its grant (it waited more than 90 %% of its TTL)")
		}
		return g.Valid()
	})
	select {
	case k := <-lost:
		t.Fatalf("OnLost called for %s", k)
	default:
	}
	g.Release()
}

// A released guard is not valid: the holder stops believing when it sends
// the release (docs/concepts/sessions-and-leases.md, the lease rule), not when the lease it counted runs
// out.
func TestAReleasedGuardIsNotValid(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	ctx := ctxFor(t, 30*time.Second)
	g, err := c.Acquire(ctx, key(t), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Valid() {
		t.Fatal("a fresh grant is valid")
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if g.Valid() {
		t.Fatalf("valid after Unlock (the count ran to %v)", g.LeaseEnd())
	}
	if err := g.Downgrade(ctx); err == nil || !strings.Contains(err.Error(), "released") {
		t.Fatalf("Downgrade of a released guard: %v", err)
	}
	select {
	case <-g.Lost():
		t.Fatal("Lost is never closed by a release")
	default:
	}
}

// An Unlock that failed (no node reachable) can be called again and sends
// the release again, as in the Rust and Python clients: the key is free at
// once after the retry instead of after the session's TTL.
func TestAFailedUnlockCanBeRetried(t *testing.T) {
	cl, err := startCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.stop()
	c := newClient(t, cl.endpoints(), Options{TTL: 60 * time.Second, RetryTimeout: time.Second})
	k := key(t)
	ctx := ctxFor(t, 60*time.Second)
	g, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.nodes {
		cl.kill(n)
	}
	if err := g.Unlock(ctx); err == nil {
		t.Fatal("Unlock with every node down answered nil")
	}
	if g.Valid() {
		t.Fatal("valid after a failed Unlock")
	}
	for _, n := range cl.nodes {
		if err := cl.startNode(n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.waitLeader(30*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := g.Unlock(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Unlock again: %v", err)
		}
		t.Logf("Unlock again: %v", err)
		time.Sleep(200 * time.Millisecond)
	}
	if d := describe(t, c, k); d.Exists {
		t.Fatalf("after the retried Unlock the key is still held: %+v", d)
	}
}
