package raftlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAcquireAllTakesEveryKeyAtOnceWithConsecutiveFences(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	a, b := key(t)+"/a", key(t)+"/b"
	ctx := ctxFor(t, 30*time.Second)
	m, err := c.AcquireAll(ctx, []Spec{{Key: b}, {Key: a, Shared: true}}, AcquireOptions{Try: true})
	if err != nil {
		t.Fatal(err)
	}
	gs := m.Grants()
	if len(gs) != 2 || gs[0].Key != b || gs[0].Shared || gs[1].Key != a || !gs[1].Shared {
		t.Fatalf("grants %+v, want b exclusive then a shared", gs)
	}
	if gs[1].Fence != gs[0].Fence+1 {
		t.Fatalf("fences %d, %d: one write takes consecutive fences", gs[0].Fence, gs[1].Fence)
	}
	for _, g := range gs {
		d := describe(t, c, g.Key)
		if len(d.Info.Holders) != 1 || uint64(d.Info.Holders[0].Fence) != g.Fence || uint64(d.Info.Holders[0].SessionID) != m.SessionID() {
			t.Fatalf("%s: %+v, want the grant of fence %d", g.Key, d, g.Fence)
		}
	}
	if !m.Valid() {
		t.Fatal("a fresh MultiGuard is not valid")
	}
	m.Release()
	m.Release()
	for _, k := range []string{a, b} {
		if d := describe(t, c, k); d.Exists {
			t.Fatalf("%s still exists after Release: %+v", k, d)
		}
	}
}

func TestAcquireAllIsAllOrNothing(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	a, b := key(t)+"/a", key(t)+"/b"
	ctx := ctxFor(t, 30*time.Second)
	holder, err := c.Acquire(ctx, b, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := c.AcquireAll(ctx, []Spec{{Key: a}, {Key: b}}, AcquireOptions{Try: true}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("AcquireAll over a held key: %v, want ErrNotAcquired", err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	started := time.Now()
	if _, err := c.AcquireAll(short, []Spec{{Key: a}, {Key: b}}, AcquireOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a bounded AcquireAll: %v, want DeadlineExceeded", err)
	}
	if time.Since(started) < 300*time.Millisecond {
		t.Fatalf("gave up after %v, before the deadline", time.Since(started))
	}
	// Nothing held on a, nothing queued on b.
	if d := describe(t, c, a); d.Exists {
		t.Fatalf("a after the failed requests: %+v", d)
	}
	if d := describe(t, c, b); len(d.Info.Holders) != 1 || len(d.Info.Waiters) != 0 {
		t.Fatalf("b after the failed requests: %+v, want the holder alone", d)
	}
}

func TestAWaitingAcquireAllQueuesOnEveryKeyAndIsGrantedTogether(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	a, b := key(t)+"/a", key(t)+"/b"
	ctx := ctxFor(t, 30*time.Second)
	holder, err := c.Acquire(ctx, b, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *MultiGuard, 1)
	go func() {
		m, err := c.AcquireAll(ctx, []Spec{{Key: a}, {Key: b}}, AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		got <- m
	}()
	eventually(t, 10*time.Second, "the request queued on both keys", func() bool {
		return len(describe(t, c, a).Info.Waiters) == 1 && len(describe(t, c, b).Info.Waiters) == 1
	})
	// a is free, but the request waits in its queue: nobody passes it.
	if _, err := c.Acquire(ctx, a, AcquireOptions{Try: true}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a try on a key an atomic request waits for: %v, want ErrNotAcquired", err)
	}
	holder.Release()
	m := <-got
	if m == nil {
		t.FailNow()
	}
	defer m.Release()
	if gs := m.Grants(); gs[0].Fence <= holder.Fence() || gs[1].Fence != gs[0].Fence+1 {
		t.Fatalf("grants %+v after holder fence %d", gs, holder.Fence())
	}
}

func TestAtomicRequestsInOppositeOrdersNeverDeadlock(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	a, b, d := key(t)+"/a", key(t)+"/b", key(t)+"/d"
	ctx := ctxFor(t, 60*time.Second)
	orders := [][]Spec{{{Key: a}, {Key: b}, {Key: d}}, {{Key: d}, {Key: b}, {Key: a}}, {{Key: b}, {Key: a}}}
	errs := make(chan error, len(orders))
	for _, o := range orders {
		o := o
		go func() {
			for i := 0; i < 6; i++ {
				m, err := c.AcquireAll(ctx, o, AcquireOptions{})
				if err != nil {
					errs <- err
					return
				}
				m.Release()
			}
			errs <- nil
		}()
	}
	for range orders {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestAcquireAllInputIsCheckedAtItsEdges(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	var specs []Spec
	for i := 0; i <= MaxKeysPerAcquireAll; i++ {
		specs = append(specs, Spec{Key: fmt.Sprintf("%s/%d", k, i)})
	}
	for _, bad := range [][]Spec{nil, specs, {{Key: k}, {Key: k}}, {{Key: ""}}, {{Key: strings.Repeat("x", MaxKeyBytes+1)}}} {
		if _, err := c.AcquireAll(ctx, bad, AcquireOptions{Try: true}); err == nil || errors.Is(err, ErrNotAcquired) {
			t.Fatalf("AcquireAll of %d specs: %v, want a refusal", len(bad), err)
		}
	}
	if _, err := c.AcquireAll(ctx, []Spec{{Key: k}}, AcquireOptions{Shared: true}); err == nil {
		t.Fatal("AcquireOptions.Shared was accepted")
	}
	if d := describe(t, c, specs[0].Key); d.Exists {
		t.Fatalf("a refused request left %+v", d)
	}
	// Exactly the limit is granted.
	m, err := c.AcquireAll(ctx, specs[:MaxKeysPerAcquireAll], AcquireOptions{Try: true})
	if err != nil {
		t.Fatalf("AcquireAll of %d keys: %v", MaxKeysPerAcquireAll, err)
	}
	if len(m.Grants()) != 64 {
		t.Fatalf("%d grants", len(m.Grants()))
	}
	m.Release()
}

func TestALoneReaderUpgradesToANewFenceAndDowngradesKeepingIt(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	g, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	read := g.Fence()
	if err := g.Upgrade(ctx, true); err != nil {
		t.Fatal(err)
	}
	if g.Shared() || g.Fence() <= read {
		t.Fatalf("after Upgrade: shared %v fence %d (read %d)", g.Shared(), g.Fence(), read)
	}
	d := describe(t, c, k)
	if len(d.Info.Holders) != 1 || uint64(d.Info.Holders[0].Fence) != g.Fence() || d.Info.Holders[0].Mode == "MODE_SHARED" {
		t.Fatalf("after Upgrade: %+v", d)
	}
	if _, err := c.Acquire(ctx, k, AcquireOptions{Shared: true, Try: true}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("a reader beside the upgraded lock: %v", err)
	}
	if err := g.Upgrade(ctx, true); err == nil {
		t.Fatal("an exclusive lock was upgraded")
	}
	write := g.Fence()
	if err := g.Downgrade(ctx); err != nil {
		t.Fatal(err)
	}
	if !g.Shared() || g.Fence() != write {
		t.Fatalf("after Downgrade: shared %v fence %d, want true %d", g.Shared(), g.Fence(), write)
	}
	if err := g.Downgrade(ctx); err == nil {
		t.Fatal("a shared lock was downgraded")
	}
	r, err := c.Acquire(ctx, k, AcquireOptions{Shared: true, Try: true})
	if err != nil {
		t.Fatalf("a reader beside the downgraded lock: %v", err)
	}
	r.Release()
}

func TestAnUpgradeWaitsForTheOtherReaders(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	r1, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Release()
	r2, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Upgrade(ctx, true); !errors.Is(err, ErrNotUpgraded) {
		t.Fatalf("a try beside another reader: %v, want ErrNotUpgraded", err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := r1.Upgrade(short, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a bounded upgrade beside another reader: %v, want DeadlineExceeded", err)
	}
	if !r1.Shared() || len(describe(t, c, k).Info.Holders) != 2 {
		t.Fatal("a failed upgrade did not keep the read")
	}
	// A second reader upgrading at the same time is refused ABORTED.
	up := make(chan error, 1)
	go func() { up <- r1.Upgrade(ctx, false) }()
	eventually(t, 10*time.Second, "the upgrade waiting", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	if err := r2.Upgrade(ctx, false); !IsCode(err, "ABORTED") {
		t.Fatalf("a second upgrade: %v, want ABORTED", err)
	}
	if !r2.Shared() {
		t.Fatal("the refused upgrade changed its guard")
	}
	r2.Release()
	if err := <-up; err != nil {
		t.Fatal(err)
	}
	if r1.Shared() || r1.Fence() <= r2.Fence() {
		t.Fatalf("after the wait: shared %v fence %d", r1.Shared(), r1.Fence())
	}
}

func TestADowngradeLetsQueuedReadersIn(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 30*time.Second)
	w, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Release()
	got := make(chan *Guard, 2)
	for i := 0; i < 2; i++ {
		go func() {
			g, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
			if err != nil {
				t.Error(err)
			}
			got <- g
		}()
	}
	eventually(t, 10*time.Second, "two readers queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 2 })
	if err := w.Downgrade(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		g := <-got
		if g == nil {
			t.FailNow()
		}
		if g.Fence() <= w.Fence() {
			t.Fatalf("reader fence %d not above %d", g.Fence(), w.Fence())
		}
		g.Release()
	}
}

func TestCancelledWaitsOfAcquireAllAndUpgradeAreWithdrawn(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	a, b := key(t)+"/a", key(t)+"/b"
	ctx := ctxFor(t, 30*time.Second)
	holder, err := c.Acquire(ctx, b, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	// An AcquireAll waiting for b, its context cancelled.
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.AcquireAll(wctx, []Spec{{Key: a}, {Key: b}}, AcquireOptions{})
		done <- err
	}()
	eventually(t, 10*time.Second, "the request queued", func() bool { return len(describe(t, c, b).Info.Waiters) == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled AcquireAll: %v, want context.Canceled", err)
	}
	eventually(t, 10*time.Second, "the request withdrawn from both keys", func() bool {
		return !describe(t, c, a).Exists && len(describe(t, c, b).Info.Waiters) == 0
	})
	// An upgrade waiting for the other reader, its context cancelled: the
	// wait is withdrawn (Cancel) and the read kept.
	r, err := c.Acquire(ctx, b, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	uctx, ucancel := context.WithCancel(ctx)
	go func() { done <- r.Upgrade(uctx, false) }()
	eventually(t, 10*time.Second, "the upgrade waiting", func() bool { return len(describe(t, c, b).Info.Waiters) == 1 })
	ucancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled upgrade: %v, want context.Canceled", err)
	}
	d := describe(t, c, b)
	if len(d.Info.Waiters) != 0 || len(d.Info.Holders) != 2 || !r.Shared() {
		t.Fatalf("after the cancelled upgrade: %+v, want both reads held and no waiter", d)
	}
	// It can still be upgraded once the other reader leaves.
	holder.Release()
	if err := r.Upgrade(ctx, true); err != nil {
		t.Fatal(err)
	}
}

// An AcquireAll granted while its process is paused (SIGSTOP) past the
// grace count: the grant arrives in jeopardy, not lost (the stream stayed
// open, the session alive). It is kept: a renewal at once makes it held,
// it is not given back with an error.
func TestAnAcquireAllGrantedInJeopardyIsKept(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	holder, err := c.Acquire(ctxFor(t, 30*time.Second), k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := spawn(t, "waitall", cl.endpoints(), k, 30*time.Second)
	w.expect("WAITING", 15*time.Second)
	eventually(t, 10*time.Second, "the AcquireAll queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	w.signal(syscall.SIGSTOP)
	stopped := time.Now()
	holder.Release()
	eventually(t, 10*time.Second, "the paused waiter granted", func() bool { return len(describe(t, c, k).Info.Holders) == 1 })
	// Paused well past its grace count (675 ms), far within its TTL.
	eventually(t, 10*time.Second, "2 s paused", func() bool { return time.Since(stopped) > 2*time.Second })
	w.signal(syscall.SIGCONT)
	w.expect("HOLD", 15*time.Second)
	if line := w.expect("VALID", 15*time.Second); line != "VALID true" {
		t.Fatalf("the grant after the pause: %q", line)
	}
}
