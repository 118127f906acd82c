// Package raftlock takes raftlock locks from Go, over the nodes' HTTP/JSON
// API, with the standard library only (no module to download, no protoc).
//
// It has the shape of gitea's modules/globallock: a [Locker] whose Lock and
// TryLock return a [ReleaseFunc] that is safe to call twice, and LockAndDo.
// Unlike a Redis lock, every grant carries a fence (a number larger than
// that of every earlier grant of the name) for the stores the holder
// writes to, waiters queue in FIFO order on the leader instead of polling,
// and a lost lease is reported, never turned into a cancelled context:
//
//	locker, err := raftlock.New("10.0.0.1:7101,10.0.0.2:7101,10.0.0.3:7101", raftlock.Options{})
//	release, err := locker.Lock(ctx, "repo/42")
//	if err != nil {
//		return err
//	}
//	defer release()
//
// Each lock is a session of its own, opened and acquired in one write (the
// node's one-call Lock) and ended in another (Unlock), so goroutines of one
// process that lock the same key queue like any two processes. While a
// lock is held the client keeps a KeepAlive stream open for its session,
// renews it over the stream, and counts the lease from the moment it sent
// the last renewal the leader confirmed, for the smaller of the TTL and
// Options.EndOnDisconnect (the grace), less 10 %. If that count runs out
// before a renewal gets through (the process was paused, a failover, the
// cluster was unreachable), the lock is in jeopardy: Guard.Valid is false,
// nothing is reported, renewals go on, and the next renewal answered makes
// it valid again. The lock is reported lost (Guard.Lost is closed and
// Options.OnLost is called; final) only when a node answers that the
// session has ended, or when no renewal was answered for the TTL less
// 10 %. The holder's work goes on either way, and the stores' fence checks
// refuse it if someone else holds the lock by then.
//
// A Lock waits until the lock is granted or its context ends. A cancelled
// context closes the waiting request's connection, and the node withdraws
// the wait and closes its session; a context with a deadline is sent as the
// wait's timeout, so the node answers "not acquired" at the deadline. A
// process killed while it waits leaves nothing queued (its connection
// closes). A process killed while it holds a lock frees it a grace
// (Options.EndOnDisconnect) after its keep-alive stream's connection
// closes with it; with EndOnDisconnect off, when the session's TTL runs
// out.
package raftlock

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Limits and defaults. The TTL bounds and the key length are the node's.
const (
	// DefaultTTL is the lease of a lock's session when Options.TTL is 0.
	DefaultTTL = 10 * time.Second
	// MinTTL is the shortest lease a node accepts.
	MinTTL = time.Second
	// MaxTTL is the longest lease a node accepts.
	MaxTTL = time.Hour
	// MaxKeyBytes is the longest key (lock name) in bytes of UTF-8.
	MaxKeyBytes = 512
	// DefaultRetryTimeout is Options.RetryTimeout when it is 0.
	DefaultRetryTimeout = 15 * time.Second
	// MaxAttemptTimeout bounds one attempt of a request that does not wait
	// in a queue: an attempt that gets no answer by then is retried on the
	// next node.
	MaxAttemptTimeout = 5 * time.Second
	// DefaultEndOnDisconnect is Options.EndOnDisconnect when it is 0.
	DefaultEndOnDisconnect = 750 * time.Millisecond
	// MaxEndOnDisconnect is the longest grace a node accepts.
	MaxEndOnDisconnect = time.Minute
)

// Locker is gitea's globallock.Locker; *Client implements it.
type Locker interface {
	// Lock waits until it holds key or ctx ends. The ReleaseFunc is never
	// nil, even with an error.
	Lock(ctx context.Context, key string) (ReleaseFunc, error)
	// TryLock takes key if it is free and answers false at once if it is
	// not (with no error). The ReleaseFunc is never nil.
	TryLock(ctx context.Context, key string) (bool, ReleaseFunc, error)
}

// ReleaseFunc releases a lock. Calling it again, or after a failed Lock,
// does nothing.
type ReleaseFunc func()

// Options configure a Client. The zero value is usable.
type Options struct {
	// Token, when set, is sent as "Authorization: Bearer TOKEN" with every
	// request (for clusters with access control).
	Token string
	// TTL is the lease of each lock's session: MinTTL..=MaxTTL, DefaultTTL
	// when 0. A holder renews it every TTL/3; a holder whose process dies
	// blocks the lock for at most this long.
	TTL time.Duration
	// RetryTimeout bounds how long one request keeps retrying while no node
	// answers or no leader is known (DefaultRetryTimeout when 0). It does
	// not bound a Lock's wait in the queue: the context does that.
	RetryTimeout time.Duration
	// EndOnDisconnect is the grace after which a lock's session ends once
	// its keep-alive stream is gone, when the process holding it dies (its
	// connection closes): the next holder gets the lock then, not a TTL
	// later. DefaultEndOnDisconnect when 0; negative: off (only the TTL
	// ends a dead holder's session); at most MaxEndOnDisconnect, whole
	// milliseconds. Each held lock keeps one streaming KeepAlive open
	// (HTTP, newline-delimited JSON) and renews over it every third of the
	// smaller of the grace and the TTL; the lease is believed (Guard.Valid)
	// for that smaller span (less 10 %) after the last renewal's send,
	// since a paused process cannot tell when its stream closed. Past it
	// the lock is in jeopardy, not lost (see Guard.Valid and Guard.Lost).
	EndOnDisconnect time.Duration
	// OnLost, when set, is called once, in a goroutine of its own, for each
	// held lock that is lost: its session ended, or no renewal was answered
	// within the TTL count (see Guard.Lost). It is not called while a lock
	// is in jeopardy (see Guard.Valid). Nothing is cancelled.
	OnLost func(key string, fence uint64)
	// HTTPClient sends the requests; set it for TLS (endpoints with
	// https://). Its Timeout must be 0: a Lock waits in one long request.
	// The default client connects within 2 s and uses no proxy.
	HTTPClient *http.Client
}

// Client takes locks from a raftlock cluster. It is safe for concurrent
// use; one per process is enough.
type Client struct {
	endpoints    []string // base URLs, "http://host:port"
	token        string
	ttl          time.Duration
	retryTimeout time.Duration
	grace        time.Duration // end_on_disconnect (0: off)
	onLost       func(key string, fence uint64)
	http         *http.Client

	mu     sync.Mutex
	leader string // base URL of the node that last answered a write, or ""
	next   int    // the endpoint to try after a failure

	asks atomic.Uint64 // KeepAlive ask ids
}

var _ Locker = (*Client)(nil)

// New returns a client of the cluster whose nodes are listed in endpoints,
// comma-separated: "host:port" (plain HTTP) or "http://host:port" or
// "https://host:port". Any node will do; the client follows the leader.
func New(endpoints string, opts Options) (*Client, error) {
	var bases []string
	for _, e := range strings.Split(endpoints, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		base, err := endpointURL(e)
		if err != nil {
			return nil, err
		}
		bases = append(bases, base)
	}
	if len(bases) == 0 {
		return nil, invalidArgument("no endpoints in %q", endpoints)
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	retry := opts.RetryTimeout
	if retry == 0 {
		retry = DefaultRetryTimeout
	}
	if retry < 0 {
		return nil, invalidArgument("RetryTimeout %v is negative", retry)
	}
	grace := opts.EndOnDisconnect
	switch {
	case grace == 0:
		grace = DefaultEndOnDisconnect
	case grace < 0:
		grace = 0
	case grace > MaxEndOnDisconnect || grace%time.Millisecond != 0:
		return nil, invalidArgument("EndOnDisconnect %v: must be whole milliseconds, at most %v (negative: off)", grace, MaxEndOnDisconnect)
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		}}
	} else if hc.Timeout != 0 {
		return nil, invalidArgument("Options.HTTPClient.Timeout must be 0 (a Lock waits in one long request; use contexts)")
	}
	return &Client{
		endpoints:    bases,
		token:        opts.Token,
		ttl:          ttl,
		retryTimeout: retry,
		grace:        grace,
		onLost:       opts.OnLost,
		http:         hc,
	}, nil
}

func endpointURL(e string) (string, error) {
	raw := e
	if !strings.Contains(e, "://") {
		raw = "http://" + e
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", invalidArgument("endpoint %q: %v", e, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", invalidArgument("endpoint %q: the scheme must be http or https", e)
	}
	if u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "", invalidArgument("endpoint %q: want host:port or http(s)://host:port", e)
	}
	return u.Scheme + "://" + u.Host, nil
}

func checkTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL || ttl%time.Millisecond != 0 {
		return invalidArgument("TTL %v: must be whole milliseconds in %v..=%v", ttl, MinTTL, MaxTTL)
	}
	return nil
}

// invalidArgument is the error of bad input the client refuses before
// sending anything: the node's code for it, with no HTTP status.
func invalidArgument(format string, args ...interface{}) *Error {
	return &Error{Code: "INVALID_ARGUMENT", Message: fmt.Sprintf(format, args...)}
}

func checkKey(key string) error {
	if len(key) == 0 || len(key) > MaxKeyBytes || !utf8.ValidString(key) {
		return invalidArgument("key of %d bytes: must be 1..=%d bytes of UTF-8", len(key), MaxKeyBytes)
	}
	return nil
}

// nonce identifies one lock attempt across its retries: never 0 (0 turns
// the node's de-duplication off).
func nonce() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic("raftlock: no randomness: " + err.Error())
		}
		if n := binary.LittleEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}
