package raftlock

// The three states of a held lock (README, "Keeping the lock"): held
// (Valid), jeopardy (the grace count ran out, the ttl count did not: not
// Valid, nothing reported lost, renewals go on) and lost (final).

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// lostClosed reports whether g.Lost() is closed now.
func lostClosed(g *Guard) bool {
	select {
	case <-g.Lost():
		return true
	default:
		return false
	}
}

// A failover longer than the grace (the nodes' election timeout is 3-4 s
// here, the grace the default 750 ms) but far shorter than the TTL: while
// no renewal gets through the holder is in jeopardy (Valid false) with
// nothing reported lost, and once the new leader answers a renewal it is
// held again.
func TestAFailoverIsJeopardyNotLoss(t *testing.T) {
	cl, err := startCluster(3, "--election-timeout-min-ms", "3000", "--election-timeout-max-ms", "4000")
	if err != nil {
		t.Fatal(err)
	}
	defer cl.stop()
	var onLost atomic.Int32
	c := newClient(t, cl.endpoints(), Options{TTL: 30 * time.Second, OnLost: func(string, uint64) { onLost.Add(1) }})
	k := key(t)
	ctx := ctxFor(t, 120*time.Second)
	g, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	old, err := cl.waitLeader(10*time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	cl.kill(old)
	killed := time.Now()
	eventually(t, 20*time.Second, "the holder in jeopardy (Valid false) while no node leads", func() bool { return !g.Valid() })
	inJeopardy := time.Now()
	if lostClosed(g) || onLost.Load() != 0 {
		t.Fatalf("in jeopardy %v after the leader's death: Lost closed %v, OnLost called %d times; want neither",
			inJeopardy.Sub(killed).Round(time.Millisecond), lostClosed(g), onLost.Load())
	}
	if _, err := cl.waitLeader(60*time.Second, old.id); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the holder held again (Valid true) after the new leader renewed it", func() bool {
		if lostClosed(g) {
			t.Fatalf("reported lost across the failover (Lost closed, seen %v after the leader's death)", time.Since(killed).Round(time.Millisecond))
		}
		return g.Valid()
	})
	t.Logf("jeopardy from %v to %v after the leader's death", inJeopardy.Sub(killed).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	if n := onLost.Load(); n != 0 {
		t.Fatalf("OnLost called %d times across the failover", n)
	}
	if cur, err := c.CheckFence(ctx, k, g.Fence()); err != nil || !cur {
		t.Fatalf("after the failover the holder's fence is current %v (%v)", cur, err)
	}
}

// No renewal answered at all (every node is gone): jeopardy once the
// grace count runs out, and lost (Lost closed, OnLost called once) only
// when the TTL count (the TTL - 10 % from when the last renewal's answer
// came) has passed.
func TestNoRenewalWithinTheTTLCountIsLost(t *testing.T) {
	cl, err := startCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.stop()
	onLost := make(chan uint64, 4)
	ttl := 3 * time.Second
	c := newClient(t, cl.endpoints(), Options{TTL: ttl, RetryTimeout: 2 * time.Second, OnLost: func(_ string, f uint64) { onLost <- f }})
	g, err := c.Acquire(ctxFor(t, 30*time.Second), key(t), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.nodes {
		cl.kill(n)
	}
	eventually(t, 10*time.Second, "jeopardy (Valid false, Lost not closed)", func() bool { return !g.Valid() && !lostClosed(g) })
	select {
	case <-g.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("not reported lost within 30 s of the last node's death")
	}
	lostAt := time.Now()
	g.mu.Lock()
	ttlEnd := g.ttlEnd
	g.mu.Unlock()
	if lostAt.Before(ttlEnd) {
		t.Fatalf("reported lost %v before the TTL count ran out", ttlEnd.Sub(lostAt).Round(time.Millisecond))
	}
	select {
	case f := <-onLost:
		if f != g.Fence() {
			t.Fatalf("OnLost got fence %d, want %d", f, g.Fence())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("OnLost not called within 10 s of Lost")
	}
	if g.Valid() {
		t.Fatal("valid after the loss")
	}
	// The keep-alive has ended (renewals stop once lost) and OnLost was
	// called once.
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the keep-alive goes on after the loss")
	}
	if n := len(onLost); n != 0 {
		t.Fatalf("OnLost called %d more times", n)
	}
}

// An operator's RevokeSession: the next renewal is answered expired, and
// the lock is lost then (Lost closed, OnLost once, Valid false).
func TestARevokedSessionIsLostAtItsNextRenewal(t *testing.T) {
	cl := shared(t)
	onLost := make(chan uint64, 4)
	c := newClient(t, cl.endpoints(), Options{TTL: 3 * time.Second, OnLost: func(_ string, f uint64) { onLost <- f }})
	g, err := c.Acquire(ctxFor(t, 30*time.Second), key(t), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	revoked := make(chan error, 1)
	go func() {
		// It answers once the session has ended: up to a TTL later.
		revoked <- cl.leaderPost("cluster/RevokeSession", fmt.Sprintf(`{"session_id": "%d"}`, g.SessionID()), nil, 30*time.Second)
	}()
	select {
	case f := <-onLost:
		if f != g.Fence() {
			t.Fatalf("OnLost got fence %d, want %d", f, g.Fence())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the revoked session was not reported lost within 15 s")
	}
	if !lostClosed(g) || g.Valid() {
		t.Fatalf("after OnLost: Lost closed %v, Valid %v", lostClosed(g), g.Valid())
	}
	if err := <-revoked; err != nil {
		t.Fatal(err)
	}
	<-g.done
	if n := len(onLost); n != 0 {
		t.Fatalf("OnLost called %d more times", n)
	}
}

// A wait longer than the TTL (the holder keeps the lock one and a half
// TTLs): the grant that ends it is held, and renewed, not counted lost at
// once because the Lock that waited was sent more than a TTL ago. The TTL
// is 5 s, so that on a busy machine the grant's first renewal has 4.5 s
// (its TTL count) to be answered.
func TestAGrantAfterAWaitLongerThanItsTTLIsHeld(t *testing.T) {
	cl := shared(t)
	var onLost atomic.Int32
	ttl := 5 * time.Second
	c := newClient(t, cl.endpoints(), Options{TTL: ttl, OnLost: func(string, uint64) { onLost.Add(1) }})
	k := key(t)
	ctx := ctxFor(t, 120*time.Second)
	holder, err := c.Acquire(ctx, k, AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type granted struct {
		g    *Guard
		sent time.Time
	}
	waited := make(chan granted, 1)
	go func() {
		sent := time.Now()
		g, err := c.Acquire(ctx, k, AcquireOptions{})
		if err != nil {
			t.Error(err)
		}
		waited <- granted{g, sent}
	}()
	eventually(t, 10*time.Second, "the waiter queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	// Released once the waiter has waited one and a half TTLs (the holder
	// renews meanwhile).
	start := time.Now()
	eventually(t, 60*time.Second, "one and a half TTLs of waiting", func() bool { return time.Since(start) > ttl*3/2 })
	holder.Release()
	got := <-waited
	if got.g == nil {
		t.FailNow()
	}
	defer got.g.Release()
	t.Logf("waited %v", time.Since(got.sent).Round(time.Millisecond))
	eventually(t, 30*time.Second, "the grant valid", func() bool {
		if lostClosed(got.g) {
			t.Fatalf("the grant's Lost closed %v after its Acquire was sent (a wait of more than its TTL)", time.Since(got.sent).Round(time.Millisecond))
		}
		return got.g.Valid()
	})
	// Still held (renewed) two TTLs later.
	later := time.Now()
	eventually(t, 60*time.Second, "two TTLs held", func() bool {
		if lostClosed(got.g) {
			t.Fatalf("lost %v after the grant", time.Since(later).Round(time.Millisecond))
		}
		return time.Since(later) > 2*ttl
	})
	eventually(t, 30*time.Second, "the grant valid", got.g.Valid)
	if n := onLost.Load(); n != 0 {
		t.Fatalf("OnLost called %d times", n)
	}
}
