package raftlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrNotAcquired is the error of an Acquire with Try set whose key was
// held by another.
var ErrNotAcquired = errors.New("raftlock: not acquired: the key is held")

// deadlineSlack is how long after its context's deadline a waiting Lock
// request still waits for the node's own "not acquired" answer (the node
// was told the deadline as the wait's timeout) before it closes the
// connection instead.
const deadlineSlack = 2 * time.Second

// MaxCapacity is the largest semaphore capacity a node accepts.
const MaxCapacity = 1_000_000

// AcquireOptions say how Acquire takes a key. The zero value waits for an
// exclusive lock with the client's TTL.
type AcquireOptions struct {
	// Shared takes a shared (read) lock: held together with other shared
	// holders, never with an exclusive one.
	Shared bool
	// Capacity, when not 0, makes the key a semaphore of that many permits
	// (1..=MaxCapacity) and takes Weight of them: holders' weights add up
	// to at most Capacity, and a request that does not fit waits (or, with
	// Try, is not acquired) as a lock's does. Every holder and waiter of
	// one semaphore must give the same capacity (the node refuses another
	// with FAILED_PRECONDITION), and a key is either a lock or a
	// semaphore. Not with Shared.
	Capacity uint32
	// Weight is how many permits of the semaphore to take, 1..=Capacity (0
	// means 1). Only with Capacity.
	Weight uint32
	// Try answers ErrNotAcquired at once if the key is not free, instead
	// of waiting in the queue.
	Try bool
	// TTL overrides Options.TTL for this lock (MinTTL..=MaxTTL; 0: the
	// client's).
	TTL time.Duration
}

type lockRequest struct {
	Name      string `json:"name"`
	TTLMs     u64    `json:"ttl_ms"`
	TimeoutMs u64    `json:"timeout_ms,omitempty"`
	Wait      bool   `json:"wait,omitempty"`
	Mode      string `json:"mode,omitempty"`
	Weight    uint32 `json:"weight,omitempty"`
	Capacity  uint32 `json:"capacity,omitempty"`
	Nonce     u64    `json:"nonce"`
	// The session ends a grace after its last stream (0: off).
	EndOnDisconnectMs u64 `json:"end_on_disconnect_ms,omitempty"`
}

type lockResponse struct {
	Acquired  bool `json:"acquired"`
	Fence     u64  `json:"fence"`
	SessionID u64  `json:"session_id"`
	TTLMs     u64  `json:"ttl_ms"`
	NextSeq   u64  `json:"next_seq"`
}

type unlockRequest struct {
	SessionID u64 `json:"session_id"`
}

type keepAliveRequest struct {
	SessionID u64 `json:"session_id"`
	AskID     u64 `json:"ask_id"`
}

type keepAliveResponse struct {
	SessionID u64  `json:"session_id"`
	TTLMs     u64  `json:"ttl_ms"`
	Expired   bool `json:"expired"`
	AskID     u64  `json:"ask_id"`
}

// Acquire takes key and returns its Guard: the fence, the lease view and
// the release. Without Try it waits in the key's FIFO queue until granted
// or ctx ends: a cancelled ctx withdraws the wait (the request's
// connection closes, and the node withdraws the wait and closes its
// session); a ctx deadline is sent as the wait's timeout, and passing it
// gives an error that matches context.DeadlineExceeded with errors.Is.
//
// Every Acquire opens a session of its own (one write, the node's one-call
// Lock), so goroutines of one Client that want the same key queue for it
// like separate processes. Release ends the session (one write).
//
// A grant that waited long is renewed at once before Acquire returns: the
// count from the request's send has mostly run out. If that renewal gets
// no answer in time (a failover, a busy node), the Guard is returned in
// jeopardy: Valid is false until a later renewal is answered, and Lost is
// closed if none is within the TTL count (docs/concepts/sessions-and-leases.md:
// Held, jeopardy, lost; the Python client does the same, the Rust client
// waits until the grant is held again or lost). Check Valid before acting
// on the lock, not only the error.
func (c *Client) Acquire(ctx context.Context, key string, o AcquireOptions) (*Guard, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	ttl := o.TTL
	if ttl == 0 {
		ttl = c.ttl
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	req := lockRequest{Name: key, TTLMs: u64(ttl.Milliseconds()), EndOnDisconnectMs: u64(c.grace.Milliseconds())}
	weight, err := checkPermits(o)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Capacity != 0:
		req.Mode, req.Weight, req.Capacity = "MODE_SEMAPHORE", weight, o.Capacity
	case o.Shared:
		req.Mode = "MODE_SHARED"
	}
	reqCtx := ctx
	deadline, hasDeadline := ctx.Deadline()
	if !o.Try {
		if hasDeadline {
			var stop func()
			reqCtx, stop = untilDeadline(ctx, deadline.Add(deadlineSlack))
			defer stop()
		} else {
			req.Wait = true
		}
	}
	// A Lock that waits has no attempt timeout; one that does not gets the
	// usual one.
	var attemptTimeout time.Duration
	if o.Try {
		attemptTimeout = c.attemptTimeout()
	}
	var (
		resp      lockResponse
		sent      time.Time
		withdrawn int // waits withdrawn under this Acquire
	)
	for {
		if !o.Try && hasDeadline {
			left := time.Until(deadline)
			if left <= 0 {
				return nil, fmt.Errorf("raftlock: lock %q: %w", key, context.DeadlineExceeded)
			}
			req.TimeoutMs = u64((left + time.Millisecond - 1) / time.Millisecond)
		}
		// A new attempt, a new nonce; its retries keep it (and find the
		// session the first send opened, whose lease started then: the
		// lease is counted from the first send).
		req.Nonce = u64(nonce())
		sent = time.Now()
		resp = lockResponse{}
		if err := c.call(reqCtx, "locks/Lock", &req, &resp, attemptTimeout); err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("raftlock: lock %q: %w", key, ctx.Err())
			}
			if reqCtx.Err() != nil {
				return nil, fmt.Errorf("raftlock: lock %q: no answer %v after the deadline: %w", key, deadlineSlack, context.DeadlineExceeded)
			}
			return nil, err
		}
		if resp.Acquired {
			break
		}
		if o.Try {
			return nil, ErrNotAcquired
		}
		// A wait answered "not acquired" before its timeout was withdrawn
		// under it: the node closed its session because an earlier
		// attempt's connection closed. Wait again, in a new session. (The
		// node counts the timeout from when it received the request, so an
		// answer before the deadline is never the timeout.)
		if hasDeadline && !time.Now().Before(deadline) {
			return nil, fmt.Errorf("raftlock: lock %q: not granted before the context's deadline: %w", key, context.DeadlineExceeded)
		}
		// Never a busy loop, whatever the node answers.
		if withdrawn < 20 {
			withdrawn++
		}
		pause := time.NewTimer(time.Duration(withdrawn) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
			pause.Stop()
			return nil, fmt.Errorf("raftlock: lock %q: %w", key, ctx.Err())
		case <-pause.C:
		}
	}
	if resp.TTLMs != 0 {
		ttl = time.Duration(resp.TTLMs) * time.Millisecond
	}
	g := &Guard{
		c:        c,
		key:      key,
		fence:    uint64(resp.Fence),
		session:  uint64(resp.SessionID),
		ttl:      ttl,
		grace:    c.grace,
		shared:   o.Shared,
		weight:   req.Weight,
		capacity: req.Capacity,
		nextSeq:  uint64(resp.NextSeq),
		lost:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	g.credit(sent, time.Now())
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	if time.Since(sent) > g.span()/3 {
		// The call waited: the node restarted the lease as it answered,
		// but the count from the send has mostly run out (Valid may be
		// false). Renew now: an answer makes the lock held, counted from
		// this renewal's send.
		if expired := g.renew(ctx, time.Now().Add(g.span()/3)); expired {
			g.stop()
			close(g.done)
			_ = g.unlock(context.Background())
			return nil, fmt.Errorf("raftlock: lock %q: the session expired right after the grant", key)
		}
	}
	go g.keepAlive()
	return g, nil
}

// checkPermits checks the semaphore fields of o as the node would, and
// returns the weight to send (0 for a lock).
func checkPermits(o AcquireOptions) (uint32, error) {
	if o.Capacity == 0 {
		if o.Weight != 0 {
			return 0, invalidArgument("Weight %d without a Capacity: weights are for semaphores", o.Weight)
		}
		return 0, nil
	}
	if o.Shared {
		return 0, invalidArgument("a semaphore has no shared mode: set Capacity or Shared, not both")
	}
	if o.Capacity > MaxCapacity {
		return 0, invalidArgument("semaphore capacity must be 1..=%d, got %d", MaxCapacity, o.Capacity)
	}
	weight := o.Weight
	if weight == 0 {
		weight = 1
	}
	if weight > o.Capacity {
		return 0, invalidArgument("semaphore weight must be 1..=%d, got %d", o.Capacity, weight)
	}
	return weight, nil
}

// untilDeadline is a context that ends at deadline, or when parent is
// cancelled, but not when parent's own deadline passes: a waiting Lock
// request outlives its caller's deadline by a little, to hear the node's
// answer to it.
func untilDeadline(parent context.Context, deadline time.Time) (context.Context, func()) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	stop := make(chan struct{})
	go func() {
		select {
		case <-parent.Done():
			if !errors.Is(parent.Err(), context.DeadlineExceeded) {
				cancel()
			}
		case <-stop:
		}
	}()
	return ctx, func() {
		close(stop)
		cancel()
	}
}

func (c *Client) attemptTimeout() time.Duration {
	if c.retryTimeout < MaxAttemptTimeout {
		return c.retryTimeout
	}
	return MaxAttemptTimeout
}

// Lock waits until it holds key (exclusively) or ctx ends; see Acquire.
func (c *Client) Lock(ctx context.Context, key string) (ReleaseFunc, error) {
	g, err := c.Acquire(ctx, key, AcquireOptions{})
	if err != nil {
		return func() {}, err
	}
	return g.Release, nil
}

// TryLock takes key if it is free; false (and no error) if another holds
// it.
func (c *Client) TryLock(ctx context.Context, key string) (bool, ReleaseFunc, error) {
	g, err := c.Acquire(ctx, key, AcquireOptions{Try: true})
	if errors.Is(err, ErrNotAcquired) {
		return false, func() {}, nil
	}
	if err != nil {
		return false, func() {}, err
	}
	return true, g.Release, nil
}

// LockAndDo runs f while holding key, then releases it. f's context is
// ctx, carrying the Guard (GuardFrom gives it: the fence, the lease). A
// lost lease does not cancel it.
func (c *Client) LockAndDo(ctx context.Context, key string, f func(context.Context) error) error {
	g, err := c.Acquire(ctx, key, AcquireOptions{})
	if err != nil {
		return err
	}
	defer g.Release()
	return f(withGuard(ctx, g))
}

// TryLockAndDo runs f while holding key if key is free, and answers false
// without running it if not.
func (c *Client) TryLockAndDo(ctx context.Context, key string, f func(context.Context) error) (bool, error) {
	g, err := c.Acquire(ctx, key, AcquireOptions{Try: true})
	if errors.Is(err, ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer g.Release()
	return true, f(withGuard(ctx, g))
}

type guardKey struct{}

func withGuard(ctx context.Context, g *Guard) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

// GuardFrom returns the Guard of the lock that LockAndDo or TryLockAndDo
// holds while it runs f, from f's context; nil elsewhere.
func GuardFrom(ctx context.Context) *Guard {
	g, _ := ctx.Value(guardKey{}).(*Guard)
	return g
}

// Guard is one held lock: its fence, its lease and its release.
type Guard struct {
	c       *Client
	key     string
	fence   uint64
	session uint64
	ttl     time.Duration
	grace   time.Duration // end_on_disconnect (0: off): renewed over a stream
	// weight and capacity of semaphore permits (0 for a lock).
	weight, capacity uint32

	stopCtx context.Context    // ends the keep-alive loop and its requests
	stop    context.CancelFunc //
	done    chan struct{}      // closed when the keep-alive loop has ended

	mu       sync.Mutex
	shared   bool      // a shared lock (Upgrade and Downgrade change it)
	nextSeq  uint64    // the seq of the next request in the session (0: none may be sent)
	lastSent time.Time // send time of the last renewal the leader confirmed
	leaseEnd time.Time // lastSent + span - margin: held (Valid) before it
	ttlEnd   time.Time // receive time of the last lease-starting answer + ttl - 10 % of ttl: lost at it
	isLost   bool
	lost     chan struct{} // closed when isLost becomes true
	released bool          // Unlock or Release was called: the holder no longer believes
	ended    bool          // the grant ended without a Release (an upgrade withdrawn after it may have been granted)

	releaseMu   sync.Mutex // one Unlock at a time
	releaseDone bool       // an Unlock succeeded: later ones do nothing
}

// Key is the locked key.
func (g *Guard) Key() string { return g.key }

// Fence is the grant's fencing token: larger than the fence of every grant
// made before it. Pass it to the stores you write while holding the lock,
// and let them refuse writes with a smaller one.
// After an Upgrade it is the exclusive grant's new fence.
func (g *Guard) Fence() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fence
}

// Shared reports whether the lock is held shared (Upgrade and Downgrade
// change it).
func (g *Guard) Shared() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shared
}

// Weight is how many permits of a semaphore the guard holds (0 for a
// lock).
func (g *Guard) Weight() uint32 { return g.weight }

// Capacity is the capacity of the semaphore whose permits the guard holds
// (0 for a lock).
func (g *Guard) Capacity() uint32 { return g.capacity }

// SessionID is the session that holds the grant.
func (g *Guard) SessionID() uint64 { return g.session }

// TTL is the session's lease length.
func (g *Guard) TTL() time.Duration { return g.ttl }

// Lost is closed once the lock is lost: a renewal was answered "expired"
// (the session ended: revoked, or ended by its TTL or its grace), or no
// renewal was answered within the TTL count (the TTL - 10 % of it from
// when the last answer that started a lease came: the grant or a renewal).
// Nothing is cancelled; it is final, and
// renewals stop. A lock whose grace count ran out (see Valid) is in
// jeopardy, not lost: Lost is not closed then. It is never closed after
// Release.
func (g *Guard) Lost() <-chan struct{} { return g.lost }

// Valid reports, at the moment it is called, whether the lock is held by
// the client's conservative count: until LeaseEnd (it never lags a pause:
// a process resumed after that sees false at once). Past LeaseEnd, until
// the lock is lost (see Lost), the lock is in jeopardy: Valid is false,
// so do not start an action that needs the lock, but nothing is reported
// lost and renewals go on; a renewal answered by the leader makes Valid
// true again (a session the leader still renews was never ended, so no
// one else was granted the lock meanwhile). It is false from the moment
// Unlock or Release is called, once the lock is lost, and for good after
// an Upgrade withdrawn with Cancel that may have released the grant (see
// Upgrade).
func (g *Guard) Valid() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.isLost && !g.released && !g.ended && time.Now().Before(g.leaseEnd)
}

// LeaseEnd is when the client's count of the lease ends (Valid is false
// from then on, until a renewal is answered): the send time of the last
// confirmed renewal + the span - 10 % of it, the span being the TTL, or
// the smaller of the TTL and Options.EndOnDisconnect when that is on.
func (g *Guard) LeaseEnd() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.leaseEnd
}

// span is how long after a confirmed renewal's send the lease is
// believed (before the margin): the TTL, or the grace if shorter (the
// leader ends the session a grace after its stream closes, which a paused
// process cannot see).
func (g *Guard) span() time.Duration {
	if g.grace > 0 && g.grace < g.ttl {
		return g.grace
	}
	return g.ttl
}

func (g *Guard) margin() time.Duration { return g.span() / 10 }

// credit counts a lease-starting answer (the grant, an OpenSession, a
// renewal answered without "expired", the renewal through creditRenewal,
// which drops late answers): it proves the session alive, so it counts
// unless the lock is already lost (final). Belief (Valid,
// LeaseEnd) counts from sent, the send time of the request answered; the
// TTL count, which only decides when to give the lock up as lost, counts
// from received, when the answer came (a grant after a long wait gets a
// whole TTL before it can be given up).
func (g *Guard) credit(sent, received time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.isLost {
		return
	}
	if !sent.Before(g.lastSent) {
		g.lastSent = sent
		g.leaseEnd = sent.Add(g.span() - g.margin())
	}
	if end := received.Add(g.ttl - g.ttl/10); end.After(g.ttlEnd) {
		g.ttlEnd = end
	}
}

// creditRenewal credits the answer to a keep-alive sent at sent, received
// at received, as the Rust client does: only while its ask still waited
// (within: how long an ask waits before it is given up, at most the TTL)
// and before the TTL count ran out (then the lock is lost). A later answer
// is dropped: it neither makes the lock held again nor pushes the TTL
// count back. It reports whether the answer was credited.
func (g *Guard) creditRenewal(sent, received time.Time, within time.Duration) bool {
	if received.Sub(sent) > within {
		return false
	}
	g.mu.Lock()
	late := g.pastTTLCount(received)
	g.mu.Unlock()
	if late {
		return false
	}
	g.credit(sent, received)
	return true
}

// askWait is how long a unary keep-alive waits for its answer before it
// is given up (then asked again): a third of the span, at least a second
// (the Rust client's rule).
func (g *Guard) askWait() time.Duration {
	if d := g.span() / 3; d > time.Second {
		return d
	}
	return time.Second
}

// pastTTLCount reports whether no renewal was answered within the TTL
// count (the session may have expired by its TTL, stream or not). g.mu is
// held.
func (g *Guard) pastTTLCount(now time.Time) bool {
	return !g.ttlEnd.IsZero() && !now.Before(g.ttlEnd)
}

// lostNow reports whether the lock is lost: marked so, or past the TTL
// count (then the keep-alive marks it lost).
func (g *Guard) lostNow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isLost || g.pastTTLCount(time.Now())
}

// heldNow reports whether the grace count still holds (Valid, released or
// not).
func (g *Guard) heldNow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.isLost && time.Now().Before(g.leaseEnd)
}

// ttlCountEnd is when the lock is lost if no renewal is answered first.
func (g *Guard) ttlCountEnd() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ttlEnd
}

func (g *Guard) markLost() {
	g.mu.Lock()
	if g.isLost {
		g.mu.Unlock()
		return
	}
	g.isLost = true
	close(g.lost)
	fence := g.fence
	g.mu.Unlock()
	if g.c.onLost != nil {
		go g.c.onLost(g.key, fence)
	}
}

// renew sends one KeepAlive (retrying until giveUp, or until its ask's
// wait is over if sooner) and credits it. It reports whether the node
// answered that the session is gone (final).
func (g *Guard) renew(ctx context.Context, giveUp time.Time) (expired bool) {
	ask := g.c.asks.Add(1)
	sent := time.Now()
	if until := sent.Add(g.askWait()); until.Before(giveUp) {
		giveUp = until
	}
	ctx, cancel := context.WithDeadline(ctx, giveUp)
	defer cancel()
	var r keepAliveResponse
	timeout := g.span() / 6
	if timeout > MaxAttemptTimeout {
		timeout = MaxAttemptTimeout
	}
	if err := g.c.call(ctx, "locks/KeepAlive", keepAliveRequest{SessionID: u64(g.session), AskID: u64(ask)}, &r, timeout); err != nil {
		return false
	}
	if uint64(r.AskID) != ask || uint64(r.SessionID) != g.session {
		// Not the answer to this ask: never credit it.
		return false
	}
	if r.Expired {
		return true
	}
	g.creditRenewal(sent, time.Now(), g.askWait())
	return false
}

// keepAlive renews the session every TTL/3 after the last confirmed send,
// and marks the lock lost once its TTL count runs out (checked before
// every attempt, so a process resumed from a pause never renews a lapsed
// lease) or when the node answers that the session is gone.
func (g *Guard) keepAlive() {
	if g.grace > 0 {
		g.keepAliveStreamed()
		return
	}
	defer close(g.done)
	for {
		g.mu.Lock()
		due := g.lastSent.Add(g.ttl / 3)
		g.mu.Unlock()
		if !g.sleepUntil(due) {
			return
		}
		for {
			if g.lostNow() {
				g.markLost()
				return
			}
			before := g.LeaseEnd()
			expired := g.renew(g.stopCtx, g.ttlCountEnd())
			if g.stopCtx.Err() != nil {
				return
			}
			if expired {
				g.markLost()
				return
			}
			if g.LeaseEnd().After(before) {
				break
			}
			// Not renewed: try again soon, within the lease.
			if !g.sleepUntil(time.Now().Add(g.ttl / 20)) {
				return
			}
		}
	}
}

// sleepUntil waits until t; false if the guard was released meanwhile.
func (g *Guard) sleepUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return g.stopCtx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-g.stopCtx.Done():
		return false
	}
}

// Release gives the lock back (Unlock: releases the grant and ends the
// session, one write), waiting at most Options.RetryTimeout for the
// cluster. Calling it again after it worked does nothing; after it failed
// it tries again. If the cluster cannot be reached and nobody tries again,
// the session ends with its TTL (it is no longer renewed).
func (g *Guard) Release() {
	ctx, cancel := context.WithTimeout(context.Background(), g.c.retryTimeout)
	defer cancel()
	_ = g.Unlock(ctx)
}

// Unlock is Release with a context and the error: nil also when the
// session had already ended. The guard stops being Valid at the first call,
// whatever its outcome. After a call that succeeded, later ones do nothing
// and return nil; after one that failed (no node answered in time), the
// next call sends the release again.
func (g *Guard) Unlock(ctx context.Context) error {
	g.releaseMu.Lock()
	defer g.releaseMu.Unlock()
	if g.releaseDone {
		return nil
	}
	// The holder stops believing before the release is sent, and renews
	// no more.
	g.mu.Lock()
	g.released = true
	g.mu.Unlock()
	g.stop()
	<-g.done
	if err := g.unlock(ctx); err != nil {
		return err
	}
	g.releaseDone = true
	return nil
}

func (g *Guard) unlock(ctx context.Context) error {
	err := g.c.call(ctx, "locks/Unlock", unlockRequest{SessionID: u64(g.session)}, nil, g.c.attemptTimeout())
	if IsCode(err, "NOT_FOUND") {
		return nil
	}
	return err
}

type checkFenceRequest struct {
	Name  string `json:"name"`
	Fence u64    `json:"fence"`
}

type checkFenceResponse struct {
	Current     bool `json:"current"`
	LatestFence u64  `json:"latest_fence"`
}

// CheckFence asks the cluster (a linearizable read) whether fence belongs
// to a current holder of key, as a store that cannot keep the largest
// fence itself would before acting on a holder's request.
func (c *Client) CheckFence(ctx context.Context, key string, fence uint64) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	var r checkFenceResponse
	if err := c.call(ctx, "locks/CheckFence", checkFenceRequest{Name: key, Fence: u64(fence)}, &r, c.attemptTimeout()); err != nil {
		return false, err
	}
	return r.Current, nil
}
