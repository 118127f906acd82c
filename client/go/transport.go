package raftlock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Error is an answer of a node that refused a request: the gRPC status
// code's name (such as "INVALID_ARGUMENT", "PERMISSION_DENIED"), its
// message, and the HTTP status it came with. A request that found no
// leader within Options.RetryTimeout ends with Code "UNAVAILABLE" and
// HTTPStatus 0, its Message naming each node tried and its last error.
// Bad input the client refuses before sending anything (a bad key, TTL or
// endpoint) is an Error too, with Code "INVALID_ARGUMENT" and HTTPStatus
// 0, as the node would have refused it.
type Error struct {
	Code       string
	Message    string
	HTTPStatus int
	// unreachable: every endpoint refused the connection or did not
	// resolve, round after round; nothing was sent (see ErrUnreachable).
	unreachable bool
}

// ErrUnreachable is what errors.Is finds in the UNAVAILABLE error of a
// request that no node could be asked: every endpoint refused the
// connection or its name did not resolve, three rounds in a row. Nothing
// was sent, so nothing changed; the endpoints or the cluster are down or
// wrong. A request that reached nodes but found no leader within
// RetryTimeout is UNAVAILABLE without it.
var ErrUnreachable = errors.New("raftlock: no node accepts connections")

func (e *Error) Error() string {
	return "raftlock: " + e.Code + ": " + e.Message
}

// Is reports whether e is ErrUnreachable's case (for errors.Is).
func (e *Error) Is(target error) bool {
	return target == ErrUnreachable && e.unreachable
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Headers and body of the node's "not the leader" answer.
const (
	leaderHeader    = "raftlock-leader"
	notLeaderHeader = "raftlock-not-leader"
)

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Leader  string `json:"leader"`
}

// u64 is a proto3 JSON 64-bit integer: written as a string, read from a
// string or a number.
type u64 uint64

func (v u64) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatUint(uint64(v), 10) + `"`), nil
}

func (v *u64) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if s == "null" {
		*v = 0
		return nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("not a 64-bit unsigned integer: %s", b)
	}
	*v = u64(n)
	return nil
}

// attempt is what one HTTP exchange with one node gave.
type attempt struct {
	status int
	header http.Header
	body   []byte
	err    error // transport failure (no HTTP answer)
}

// post sends one request to one node.
func (c *Client) post(ctx context.Context, base, rpc string, body []byte, timeout time.Duration) attempt {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/"+rpc, bytes.NewReader(body))
	if err != nil {
		return attempt{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return attempt{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return attempt{err: err}
	}
	return attempt{status: resp.StatusCode, header: resp.Header, body: b}
}

func (c *Client) currentLeader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *Client) setLeader(base string) {
	c.mu.Lock()
	c.leader = base
	c.mu.Unlock()
}

// forget drops base as the leader, if it was, and returns the endpoint to
// try next (round robin over the configured ones).
func (c *Client) forget(base string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == base {
		c.leader = ""
	}
	next := c.endpoints[c.next%len(c.endpoints)]
	c.next++
	if next == base && len(c.endpoints) > 1 {
		next = c.endpoints[c.next%len(c.endpoints)]
		c.next++
	}
	return next
}

// call sends rpc ("locks/Lock", "cluster/Status", ...) to the leader and
// decodes its answer into out. It follows leader hints at once, moves to
// the next node on a transport error or when a node knows no leader, and
// backs off (with jitter) only after every node failed in a row. It gives
// up when ctx ends or after RetryTimeout without an answer; an attempt
// that itself lasted longer (a Lock that waited) restarts that count.
//
// Every request the client sends is safe to repeat (a Lock carries its
// nonce, Unlock and KeepAlive are idempotent), so an attempt whose outcome
// is unknown is simply sent again.
//
// attemptTimeout bounds each attempt (0: only ctx does, for a Lock that
// waits in the queue).
func (c *Client) call(ctx context.Context, rpc string, in, out interface{}, attemptTimeout time.Duration) error {
	body, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("raftlock: encoding %s: %v", rpc, err)
	}
	target := c.currentLeader()
	if target == "" {
		target = c.forget("")
	}
	var (
		budgetStart = time.Now()
		failures    = map[string]string{}
		order       []string
		failed      int // attempts in a row that found no leader
		hints       int // leader hints followed in a row
		backoff     = firstBackoff
		// Attempts in a row, per endpoint, that cannot have sent the
		// request (refused, or the name did not resolve); any other
		// outcome clears them.
		hopeless = map[string]int{}
		// Endpoints that answered that they do not serve this call.
		unserved = map[string]bool{}
	)
	note := func(base, what string) {
		if _, seen := failures[base]; !seen {
			order = append(order, base)
		}
		failures[base] = what
	}
	// Each node tried and its last error, in the order first tried.
	tried := func() string {
		var parts []string
		for _, base := range order {
			parts = append(parts, base+": "+failures[base])
		}
		return strings.Join(parts, "; ")
	}
	for {
		started := time.Now()
		a := c.post(ctx, target, rpc, body, attemptTimeout)
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(started) > c.retryTimeout {
			budgetStart = time.Now()
		}
		if why := unreachable(a.err); why != "" {
			note(target, why)
			hopeless[target]++
			if c.hopelessEverywhere(hopeless) {
				return &Error{Code: "UNAVAILABLE", Message: fmt.Sprintf("no node accepts connections (each refused or did not resolve every attempt): %s", tried()), unreachable: true}
			}
		} else {
			for k := range hopeless {
				delete(hopeless, k)
			}
		}
		switch {
		case a.err != nil:
			if unreachable(a.err) == "" {
				note(target, a.err.Error())
			}
			target = c.forget(target)
			failed++
			hints = 0
		case a.status == http.StatusOK:
			// A follower forwards to the leader and names it in the
			// answer: go there directly from now on.
			if hint := a.header.Get(leaderHeader); hint != "" {
				c.setLeader(schemeOf(target) + "://" + hint)
			} else {
				c.setLeader(target)
			}
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(a.body, out); err != nil {
				return fmt.Errorf("raftlock: %s answered %q: %v", rpc, a.body, err)
			}
			return nil
		case a.status == http.StatusServiceUnavailable:
			e, leader := parseError(a)
			hint := a.header.Get(leaderHeader)
			if hint == "" {
				hint = leader
			}
			note(target, e.Code+": "+e.Message)
			if hint != "" && a.header.Get(notLeaderHeader) != "" && hints <= len(c.endpoints) {
				target = schemeOf(target) + "://" + hint
				c.setLeader(target)
				hints++
				continue // no sleep: the hint names the leader
			}
			target = c.forget(target)
			failed++
			hints = 0
		case notServed(a):
			// Not a raftlock node, or one without this call: another
			// service on a dead node's port, an older raftlock during an
			// upgrade. Nothing was done there: ask the others at once;
			// once every endpoint has answered so, that is the answer.
			note(target, "does not serve this call: "+decodeError(a).Message)
			unserved[target] = true
			if c.servedNowhere(unserved) {
				return &Error{Code: "UNIMPLEMENTED", Message: fmt.Sprintf("no endpoint serves %s: %s", rpc, tried()), HTTPStatus: a.status}
			}
			target = c.forget(target)
			hints = 0
			continue
		case a.status == http.StatusGatewayTimeout || a.status == 499:
			// DEADLINE_EXCEEDED or CANCELLED from the node: the outcome is
			// unknown, and the same request (same nonce, same session)
			// learns it.
			e := decodeError(a)
			note(target, e.Code+": "+e.Message)
			failed++
			hints = 0
		default:
			return decodeError(a)
		}
		if time.Since(budgetStart) > c.retryTimeout {
			return &Error{Code: "UNAVAILABLE", Message: fmt.Sprintf("no leader answered %s within %v (%s)", rpc, c.retryTimeout, tried())}
		}
		if failed >= len(c.endpoints) {
			failed = 0
			// Full jitter, never past the budget.
			pause := time.Duration(mathrand.Int63n(int64(backoff))) + backoff/2
			if left := c.retryTimeout - time.Since(budgetStart); pause > left {
				pause = left
			}
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			backoff = nextBackoff(backoff)
		}
	}
}

// notServed reports whether a says that its endpoint does not serve the
// call at all: a 404 or 501 that is not a raftlock error (another
// service), raftlock's own 404 for a route it does not have ("no route
// ..."), or UNIMPLEMENTED. A raftlock NOT_FOUND about a session or lock is
// an answer, not this.
func notServed(a attempt) bool {
	if a.status != http.StatusNotFound && a.status != http.StatusNotImplemented {
		return false
	}
	var b errorBody
	if err := json.Unmarshal(a.body, &b); err != nil || b.Code == "" {
		return true
	}
	return b.Code == "UNIMPLEMENTED" || (b.Code == "NOT_FOUND" && strings.HasPrefix(b.Message, "no route "))
}

// servedNowhere reports whether every endpoint said it does not serve the
// call.
func (c *Client) servedNowhere(unserved map[string]bool) bool {
	for _, e := range c.endpoints {
		if !unserved[e] {
			return false
		}
	}
	return true
}

func decodeError(a attempt) *Error {
	e, _ := parseError(a)
	return e
}

// parseError reads a node's error answer and the leader it names, if any.
func parseError(a attempt) (*Error, string) {
	var b errorBody
	if err := json.Unmarshal(a.body, &b); err != nil || b.Code == "" {
		return &Error{Code: "UNKNOWN", Message: fmt.Sprintf("HTTP %d: %q", a.status, a.body), HTTPStatus: a.status}, ""
	}
	return &Error{Code: b.Code, Message: b.Message, HTTPStatus: a.status}, b.Leader
}

func schemeOf(base string) string {
	if i := strings.Index(base, "://"); i > 0 {
		return base[:i]
	}
	return "http"
}

// The pause after every node failed in a row: full jitter around a
// backoff that starts at firstBackoff and doubles up to maxBackoff.
const (
	firstBackoff = 20 * time.Millisecond
	maxBackoff   = 200 * time.Millisecond
)

// nextBackoff is the backoff after b.
func nextBackoff(b time.Duration) time.Duration {
	if b*2 > maxBackoff {
		return maxBackoff
	}
	return b * 2
}

// refusedRounds is how many times in a row every endpoint must refuse the
// connection or fail to resolve before a request gives up without waiting
// for its retry timeout, as every raftlock client does.
const refusedRounds = 3

// unreachable says why err means the request cannot have left (the
// connection was refused, or the name did not resolve); "" otherwise.
func unreachable(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "connection refused"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "the name does not resolve (" + dns.Error() + ")"
	}
	return ""
}

// hopelessEverywhere reports whether every endpoint has failed
// refusedRounds times in a row in a way that sent nothing.
func (c *Client) hopelessEverywhere(hopeless map[string]int) bool {
	for _, e := range c.endpoints {
		if hopeless[e] < refusedRounds {
			return false
		}
	}
	return true
}
