package raftlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MaxKeysPerAcquireAll is the most keys one AcquireAll takes (the node's
// limit of names per AcquireAll request).
const MaxKeysPerAcquireAll = 64

// ErrNotUpgraded is the error of an Upgrade with try set that could not
// be granted at once: other readers hold the key. The read is still held.
var ErrNotUpgraded = errors.New("raftlock: not upgraded: other readers hold the key")

// Spec is one key of an AcquireAll: an exclusive lock, or a shared one.
type Spec struct {
	// Key is the lock's name.
	Key string
	// Shared takes a shared (read) lock.
	Shared bool
}

// Grant is one key an AcquireAll holds, with its own fence.
type Grant struct {
	// Key is the lock's name.
	Key string
	// Shared is true for a shared lock.
	Shared bool
	// Fence is this grant's fencing token.
	Fence uint64
}

type openSessionRequest struct {
	TTLMs             u64 `json:"ttl_ms"`
	Nonce             u64 `json:"nonce"`
	EndOnDisconnectMs u64 `json:"end_on_disconnect_ms,omitempty"`
}

type openSessionResponse struct {
	SessionID u64 `json:"session_id"`
	TTLMs     u64 `json:"ttl_ms"`
}

type lockSpec struct {
	Name string `json:"name"`
	Mode string `json:"mode,omitempty"`
}

type acquireAllRequest struct {
	SessionID u64        `json:"session_id"`
	Seq       u64        `json:"seq"`
	Locks     []lockSpec `json:"locks"`
	TimeoutMs u64        `json:"timeout_ms,omitempty"`
	Wait      bool       `json:"wait,omitempty"`
}

type grantJSON struct {
	Name  string `json:"name"`
	Fence u64    `json:"fence"`
	Mode  string `json:"mode"`
}

type acquireAllResponse struct {
	Acquired bool        `json:"acquired"`
	Grants   []grantJSON `json:"grants"`
}

type upgradeRequest struct {
	SessionID u64    `json:"session_id"`
	Seq       u64    `json:"seq"`
	Name      string `json:"name"`
	Fence     u64    `json:"fence"`
	TimeoutMs u64    `json:"timeout_ms,omitempty"`
	Wait      bool   `json:"wait,omitempty"`
}

type acquireResponse struct {
	Acquired bool `json:"acquired"`
	Fence    u64  `json:"fence"`
}

type downgradeRequest struct {
	SessionID u64    `json:"session_id"`
	Seq       u64    `json:"seq"`
	Name      string `json:"name"`
	Fence     u64    `json:"fence"`
}

type cancelRequest struct {
	SessionID u64    `json:"session_id"`
	Seq       u64    `json:"seq"`
	Name      string `json:"name"`
}

func modeName(shared bool) string {
	if shared {
		return "MODE_SHARED"
	}
	return ""
}

// waitFields are the timeout_ms and wait of a request that waits until
// ctx ends (Try: not at all), and the context to send it under: a
// deadline is sent as the wait's timeout, and the request outlives it by
// deadlineSlack to hear the node's "not acquired".
func waitFields(ctx context.Context, try bool) (timeoutMs u64, wait bool, reqCtx context.Context, stop func(), err error) {
	if try {
		return 0, false, ctx, func() {}, nil
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return 0, true, ctx, func() {}, nil
	}
	left := time.Until(deadline)
	if left <= 0 {
		return 0, false, ctx, func() {}, context.DeadlineExceeded
	}
	reqCtx, stop = untilDeadline(ctx, deadline.Add(deadlineSlack))
	return u64((left + time.Millisecond - 1) / time.Millisecond), false, reqCtx, stop, nil
}

// AcquireAll takes every key of specs in one atomic request (the
// AcquireAll RPC, one write): all of them, each with its own fence, or
// none. Of o, Try and TTL count as for Acquire; whether a key is shared
// is said in its Spec (o.Shared is refused). It opens a session of its
// own, as Acquire does; release the MultiGuard to give every key back and
// end it. If they cannot all be granted now, the request takes its place
// at the end of every key's queue at once and waits until it is first in
// line for all of them (holding up whoever queues behind it on each key,
// even a free one), or until ctx ends (a deadline is sent as the wait's
// timeout, and passing it gives an error that matches
// context.DeadlineExceeded); with Try it answers ErrNotAcquired at once
// instead. Two such requests never wait for each other, whatever order
// they name the keys in: there is no need to sort them.
// 1..=MaxKeysPerAcquireAll keys, each once. If the request is not granted
// or fails, or ctx is cancelled, its session is closed before AcquireAll
// returns (which withdraws the wait, or releases what it may have been
// granted), or ends with its TTL if the cluster cannot be reached. Grants
// that arrive while the session is in jeopardy (see Guard.Valid: a pause
// or a failover while it waited) are renewed at once and returned, Valid
// once a renewal is answered; only if the session was lost while it
// waited (see Guard.Lost) are they given back, with an error.
func (c *Client) AcquireAll(ctx context.Context, specs []Spec, o AcquireOptions) (*MultiGuard, error) {
	if len(specs) == 0 || len(specs) > MaxKeysPerAcquireAll {
		return nil, invalidArgument("AcquireAll of %d keys: must be 1..=%d", len(specs), MaxKeysPerAcquireAll)
	}
	if o.Shared {
		return nil, invalidArgument("AcquireAll: say Shared in each Spec, not in the options")
	}
	if o.Capacity != 0 || o.Weight != 0 {
		return nil, invalidArgument("AcquireAll takes locks: take semaphore permits with Acquire")
	}
	seen := make(map[string]bool, len(specs))
	req := acquireAllRequest{Seq: 1}
	for _, s := range specs {
		if err := checkKey(s.Key); err != nil {
			return nil, err
		}
		if seen[s.Key] {
			return nil, invalidArgument("AcquireAll names key %q twice", s.Key)
		}
		seen[s.Key] = true
		req.Locks = append(req.Locks, lockSpec{Name: s.Key, Mode: modeName(s.Shared)})
	}
	ttl := o.TTL
	if ttl == 0 {
		ttl = c.ttl
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	var (
		err    error
		stop   func()
		reqCtx context.Context
	)
	req.TimeoutMs, req.Wait, reqCtx, stop, err = waitFields(ctx, o.Try)
	defer stop()
	if err != nil {
		return nil, fmt.Errorf("raftlock: AcquireAll: %w", err)
	}
	sent := time.Now()
	var open openSessionResponse
	if err := c.call(ctx, "locks/OpenSession", openSessionRequest{TTLMs: u64(ttl.Milliseconds()), Nonce: u64(nonce()), EndOnDisconnectMs: u64(c.grace.Milliseconds())}, &open, c.attemptTimeout()); err != nil {
		return nil, err
	}
	if open.TTLMs != 0 {
		ttl = time.Duration(open.TTLMs) * time.Millisecond
	}
	g := &Guard{
		c:       c,
		key:     specs[0].Key,
		session: uint64(open.SessionID),
		ttl:     ttl,
		grace:   c.grace,
		lost:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	g.credit(sent, time.Now())
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	// Kept alive from now on, through a wait longer than the lease too.
	go g.keepAlive()
	// The session is the request's own: closing it withdraws everything.
	giveBack := func() {
		g.stop()
		<-g.done
		back, cancel := context.WithTimeout(context.Background(), c.retryTimeout)
		defer cancel()
		_ = g.unlock(back)
	}
	req.SessionID = open.SessionID
	attemptTimeout := time.Duration(0)
	if o.Try {
		attemptTimeout = c.attemptTimeout()
	}
	var resp acquireAllResponse
	err = c.call(reqCtx, "locks/AcquireAll", &req, &resp, attemptTimeout)
	switch {
	case err != nil && ctx.Err() != nil:
		giveBack()
		return nil, fmt.Errorf("raftlock: AcquireAll: %w", ctx.Err())
	case err != nil && reqCtx.Err() != nil:
		giveBack()
		return nil, fmt.Errorf("raftlock: AcquireAll: no answer %v after the deadline: %w", deadlineSlack, context.DeadlineExceeded)
	case err != nil:
		giveBack()
		return nil, err
	case !resp.Acquired && o.Try:
		giveBack()
		return nil, ErrNotAcquired
	case !resp.Acquired:
		giveBack()
		return nil, fmt.Errorf("raftlock: AcquireAll: not granted before the context's deadline: %w", context.DeadlineExceeded)
	case len(resp.Grants) != len(specs):
		giveBack()
		return nil, fmt.Errorf("raftlock: AcquireAll of %d keys was granted %d", len(specs), len(resp.Grants))
	}
	lost := g.lostNow()
	if !lost && !g.heldNow() {
		// In jeopardy as it was granted (a pause, a failover while it
		// waited): renew at once; an answer makes it held.
		lost = g.renew(ctx, time.Now().Add(g.span()/3))
	}
	if lost || g.lostNow() {
		// Lost while it waited (the session ended, or no renewal was
		// answered within the TTL count): never hand that out.
		giveBack()
		return nil, errors.New("raftlock: AcquireAll: the session was lost while it waited")
	}
	m := &MultiGuard{g: g}
	for i, gr := range resp.Grants {
		m.grants = append(m.grants, Grant{Key: specs[i].Key, Shared: gr.Mode == "MODE_SHARED", Fence: uint64(gr.Fence)})
	}
	g.mu.Lock()
	g.fence = m.grants[0].Fence
	g.mu.Unlock()
	return m, nil
}

// MultiGuard holds the keys of one AcquireAll, in one session of its own.
// If it is lost, Options.OnLost is called once for it, with its first key
// and that key's fence.
type MultiGuard struct {
	g      *Guard
	grants []Grant
}

// Grants are the keys held, in the order they were asked for, each with
// its own fence (consecutive: they were granted in one write).
func (m *MultiGuard) Grants() []Grant { return append([]Grant(nil), m.grants...) }

// SessionID is the session that holds the grants.
func (m *MultiGuard) SessionID() uint64 { return m.g.session }

// Lost is closed once the grants are lost (see Guard.Lost).
func (m *MultiGuard) Lost() <-chan struct{} { return m.g.lost }

// Valid reports whether the grants are held by the client's count: false
// in jeopardy and once lost or released (see Guard.Valid).
func (m *MultiGuard) Valid() bool { return m.g.Valid() }

// Release gives every key back and ends the session (one write); see
// Guard.Release.
func (m *MultiGuard) Release() { m.g.Release() }

// Unlock is Release with a context and the error; see Guard.Unlock.
func (m *MultiGuard) Unlock(ctx context.Context) error { return m.g.Unlock(ctx) }

// Upgrade turns this held shared lock into an exclusive one with no window
// for another writer. Granted at once if this is the key's only reader;
// otherwise it waits ahead of everyone queued (nobody new is granted the
// key meanwhile), keeping its read, until the other readers leave or ctx
// ends (a deadline is sent as the wait's timeout; passing it gives an
// error that matches context.DeadlineExceeded, the read still held). With
// try it answers ErrNotUpgraded at once instead of waiting. On success
// the Guard is exclusive (Shared false) with a new, larger Fence: use that
// one from then on. Another reader upgrading the same key at the same
// time makes this fail at once with an *Error of Code "ABORTED" (the two
// would wait for each other forever), the read still held: release it
// and take the key again. If the request gets no answer (a transport
// error, or UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED or UNKNOWN), or ctx
// is cancelled, the upgrade is withdrawn with Cancel before Upgrade
// returns, which also releases the lock if it had been granted. The
// client then asks the cluster (CheckFence) whether the read is still
// held: if it is not, or that cannot be learnt, the Guard's grant has
// ended: Valid is false for good and a later Upgrade or Downgrade is
// refused (release the Guard and start over); if it is, the Guard goes
// on holding the read.
func (g *Guard) Upgrade(ctx context.Context, try bool) error {
	g.mu.Lock()
	shared, fence, seq, released, ended := g.shared, g.fence, g.nextSeq, g.released, g.ended
	g.nextSeq++
	g.mu.Unlock()
	if released {
		return fmt.Errorf("raftlock: upgrade %q: the guard was released", g.key)
	}
	if ended {
		return fmt.Errorf("raftlock: upgrade %q: the guard's grant ended (an earlier upgrade was withdrawn)", g.key)
	}
	if !shared {
		return fmt.Errorf("raftlock: upgrade %q: only a shared lock can be upgraded", g.key)
	}
	if seq == 0 {
		return fmt.Errorf("raftlock: upgrade %q: this guard cannot send requests in its session", g.key)
	}
	req := upgradeRequest{SessionID: u64(g.session), Seq: u64(seq), Name: g.key, Fence: u64(fence)}
	var (
		err    error
		stop   func()
		reqCtx context.Context
	)
	req.TimeoutMs, req.Wait, reqCtx, stop, err = waitFields(ctx, try)
	defer stop()
	if err != nil {
		return fmt.Errorf("raftlock: upgrade %q: %w", g.key, err)
	}
	attemptTimeout := time.Duration(0)
	if try {
		attemptTimeout = g.c.attemptTimeout()
	}
	var resp acquireResponse
	err = g.c.call(reqCtx, "locks/Upgrade", &req, &resp, attemptTimeout)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code != "UNAVAILABLE" && e.Code != "UNKNOWN" && e.Code != "DEADLINE_EXCEEDED" && e.Code != "CANCELLED" {
			return err // the cluster refused it: nothing changed
		}
		// A granted upgrade ended the read, and the Cancel releases the
		// exclusive grant: the Guard then holds nothing. It is in doubt
		// (not Valid) from now on, unless the cluster shows the read
		// still held. Only a Cancel that was applied settles the upgrade
		// (one still on its way could be granted later).
		g.mu.Lock()
		g.ended = true
		g.mu.Unlock()
		back, cancel := context.WithTimeout(context.Background(), g.c.retryTimeout)
		defer cancel()
		cancelErr := g.c.call(back, "locks/Cancel", cancelRequest{SessionID: u64(g.session), Seq: u64(seq), Name: g.key}, nil, g.c.attemptTimeout())
		if cancelErr == nil {
			if held, err := g.c.CheckFence(back, g.key, fence); err == nil && held {
				g.mu.Lock()
				g.ended = false
				g.mu.Unlock()
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("raftlock: upgrade %q: %w", g.key, ctx.Err())
		}
		if reqCtx.Err() != nil {
			return fmt.Errorf("raftlock: upgrade %q: no answer %v after the deadline: %w", g.key, deadlineSlack, context.DeadlineExceeded)
		}
		return err
	}
	if !resp.Acquired {
		if try {
			return ErrNotUpgraded
		}
		return fmt.Errorf("raftlock: upgrade %q: not granted before the context's deadline: %w", g.key, context.DeadlineExceeded)
	}
	g.mu.Lock()
	g.fence, g.shared = uint64(resp.Fence), false
	g.mu.Unlock()
	return nil
}

// Downgrade turns this held exclusive lock into a shared one, at once,
// keeping its Fence (it only weakens); readers queued behind it come in.
func (g *Guard) Downgrade(ctx context.Context) error {
	g.mu.Lock()
	shared, fence, seq, released, ended := g.shared, g.fence, g.nextSeq, g.released, g.ended
	g.nextSeq++
	g.mu.Unlock()
	if released {
		return fmt.Errorf("raftlock: downgrade %q: the guard was released", g.key)
	}
	if ended {
		return fmt.Errorf("raftlock: downgrade %q: the guard's grant ended (an upgrade was withdrawn)", g.key)
	}
	if shared || g.capacity != 0 {
		return fmt.Errorf("raftlock: downgrade %q: only an exclusive lock can be downgraded", g.key)
	}
	if seq == 0 {
		return fmt.Errorf("raftlock: downgrade %q: this guard cannot send requests in its session", g.key)
	}
	req := downgradeRequest{SessionID: u64(g.session), Seq: u64(seq), Name: g.key, Fence: u64(fence)}
	if err := g.c.call(ctx, "locks/Downgrade", &req, nil, g.c.attemptTimeout()); err != nil {
		return err
	}
	g.mu.Lock()
	g.shared = true
	g.mu.Unlock()
	return nil
}
