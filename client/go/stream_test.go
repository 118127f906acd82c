package raftlock

// The keep-alive stream against a stand-in node (an HTTP server on
// loopback that answers KeepAlive as the test says), for what a real
// cluster cannot be made to do on cue: a leader that stays connected but
// answers nothing, or one that refuses every stream.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// standIn is a node that answers only KeepAlive streams, through answer:
// stream n (from 1) answers ask k (from 1 on that stream) if answer(n, k),
// after delay(n, k) if delay is set (answers stay in order, so delays add
// up).
type standIn struct {
	srv     *httptest.Server
	streams atomic.Int32
	answer  func(stream, ask int) bool
	delay   func(stream, ask int) time.Duration

	mu     sync.Mutex
	events []string // in the order they happened
}

func (s *standIn) event(e string) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
}

func (s *standIn) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

func newStandIn(t *testing.T, answer func(stream, ask int) bool) *standIn {
	return newSlowStandIn(t, answer, nil)
}

func newSlowStandIn(t *testing.T, answer func(stream, ask int) bool, delay func(stream, ask int) time.Duration) *standIn {
	s := &standIn{answer: answer, delay: delay}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/locks/KeepAlive" {
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte("{}"))
			return
		}
		n := int(s.streams.Add(1))
		// Full duplex by hand (net/http's server of Go 1.19 would read
		// the whole request body before the first answer is flushed).
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = rw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\n\r\n")
		_ = rw.Flush()
		lines := bufio.NewScanner(httputil.NewChunkedReader(rw.Reader))
		for k := 1; lines.Scan(); k++ {
			var req keepAliveRequest
			if err := json.Unmarshal(lines.Bytes(), &req); err != nil {
				return
			}
			if !s.answer(n, k) {
				continue
			}
			if s.delay != nil {
				time.Sleep(s.delay(n, k)) // the node is slow to answer
			}
			if k == 1 {
				s.event("answer " + string(rune('0'+n)))
			}
			if k == 2 && s.delay != nil {
				s.event("late " + string(rune('0'+n)))
			}
			line, _ := json.Marshal(keepAliveResponse{SessionID: req.SessionID, TTLMs: 30000, AskID: req.AskID})
			_, _ = rw.Write(append(line, '\n'))
			if err := rw.Flush(); err != nil {
				return
			}
		}
		s.event("closed " + string(rune('0'+n)))
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// guardAt is a held lock of session 7 (TTL 30 s, the default grace)
// renewed by the client's keep-alive against base.
func guardAt(t *testing.T, base string) *Guard {
	c := newClient(t, base, Options{TTL: 30 * time.Second})
	g := &Guard{c: c, key: "k", fence: 1, session: 7, ttl: 30 * time.Second, grace: c.grace,
		lost: make(chan struct{}), done: make(chan struct{})}
	now := time.Now()
	g.credit(now, now)
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	go g.keepAlive()
	t.Cleanup(func() {
		g.stop()
		<-g.done
	})
	return g
}

// A leader that stops answering on a stream that stays open: the client
// opens a new stream, and closes the silent one only once the new one has
// renewed the session (closing it first would start the grace on the
// leader with no stream renewing the session).
func TestASilentStreamIsClosedOnlyAfterItsSuccessorRenews(t *testing.T) {
	s := newStandIn(t, func(stream, ask int) bool { return stream != 1 || ask == 1 })
	g := guardAt(t, s.srv.URL)
	eventually(t, 30*time.Second, "the silent stream closed", func() bool {
		for _, e := range s.seen() {
			if e == "closed 1" {
				return true
			}
		}
		return false
	})
	ev := s.seen()
	if len(ev) < 3 || ev[0] != "answer 1" || ev[1] != "answer 2" || ev[2] != "closed 1" {
		t.Fatalf("events %v: want stream 1 answered, stream 2 answered, then stream 1 closed", ev)
	}
	if lostClosed(g) {
		t.Fatal("lost")
	}
}

// A node whose connections break at once (it accepts and closes them):
// the client tries again after the documented pauses (20 ms doubling to
// 200 ms, each 0.5-1.5 times that: at least 10+20+40+80 ms and then
// 100 ms each), not every few tens of milliseconds.
func TestBrokenStreamsAreRetriedWithTheBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	g := guardAt(t, "http://"+ln.Addr().String())
	start := time.Now()
	eventually(t, 30*time.Second, "2 s of broken streams", func() bool { return time.Since(start) > 2*time.Second })
	// The first attempt, then at most 4 + 1850/100 pauses in 2 s (one
	// connection each: a POST with a streamed body is not retried by
	// net/http).
	n := accepted.Load()
	t.Logf("%d connections in %v", n, time.Since(start).Round(time.Millisecond))
	if n > 24 {
		t.Fatalf("%d connections in %v: more than the backoff allows (24 streams)", n, time.Since(start).Round(time.Millisecond))
	}
	if lostClosed(g) {
		t.Fatal("lost within 2 s of a 30 s TTL")
	}
}

// indexOf is the position of e in ev (-1: absent).
func indexOf(ev []string, e string) int {
	for i, x := range ev {
		if x == e {
			return i
		}
	}
	return -1
}

// Two silences in a row (stream 1 stops answering, its replacement 2
// answers nothing either): the first silent stream, the one that carried
// the session, stays open until a successor (stream 3) has renewed; only
// then may it close. Closing it earlier would start the leader's grace
// with no stream renewing the session.
func TestTheOldestSilentStreamStaysOpenUntilASuccessorRenews(t *testing.T) {
	s := newStandIn(t, func(stream, ask int) bool { return (stream == 1 && ask == 1) || stream >= 3 })
	g := guardAt(t, s.srv.URL)
	eventually(t, 60*time.Second, "stream 3 answered and stream 1 closed", func() bool {
		ev := s.seen()
		return indexOf(ev, "answer 3") >= 0 && indexOf(ev, "closed 1") >= 0
	})
	ev := s.seen()
	t.Logf("events %v", ev)
	if indexOf(ev, "closed 1") < indexOf(ev, "answer 3") {
		t.Fatalf("events %v: stream 1 closed before any successor renewed (want it open until stream 3 answered)", ev)
	}
	if lostClosed(g) {
		t.Fatal("lost")
	}
}

// A node that accepts the connection and then says nothing (no TLS
// handshake), reached through a caller's HTTPClient without a handshake
// timeout: the stream's request body is never read, so writing an ask
// blocks. The silence and the TTL count go on regardless: a replacement
// stream is tried, and the lock is reported lost once its TTL count runs
// out (nothing was ever answered).
func TestABlockedAskWriteStopsNeitherSilenceNorLoss(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		accepted atomic.Int32
		mu       sync.Mutex
		conns    []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, conn) // held open, never read
			mu.Unlock()
		}
	}()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	ttl := 3 * time.Second
	c := newClient(t, "https://"+ln.Addr().String(), Options{TTL: ttl, HTTPClient: hc})
	g := &Guard{c: c, key: "k", fence: 1, session: 7, ttl: ttl, grace: c.grace,
		lost: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	g.credit(start, start)
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	go g.keepAlive()
	t.Cleanup(func() {
		g.stop()
		<-g.done
	})
	select {
	case <-g.Lost():
	case <-time.After(30 * time.Second):
		t.Fatalf("not lost within 30 s of a 3 s TTL with no answer (%d connections accepted): the TTL count stopped behind a blocked write", accepted.Load())
	}
	t.Logf("lost %v after the last answer; %d connections accepted", time.Since(start).Round(time.Millisecond), accepted.Load())
	if n := accepted.Load(); n < 2 {
		t.Fatalf("%d connection(s) accepted: no replacement stream was tried after the silence", n)
	}
}

// A node that answers every keep-alive but the first one late: each later
// than its ask's wait (the silence, 1 s at the default grace; here 1.5 s
// after it came, and the delays add up), so each ask was given up before
// its answer came. As in the Rust client, such an answer is never
// credited: it neither makes the lock held again nor pushes back the TTL
// count, so with nothing answered in time the lock is lost once its TTL
// count (3 s - 10 %) runs out.
func TestKeepAliveAnswersLaterThanTheirAsksWaitAreNotCredited(t *testing.T) {
	s := newSlowStandIn(t, func(stream, ask int) bool { return true }, func(stream, ask int) time.Duration {
		if stream == 1 && ask == 1 {
			return 0
		}
		return 1500 * time.Millisecond
	})
	ttl := 3 * time.Second
	c := newClient(t, s.srv.URL, Options{TTL: ttl})
	g := &Guard{c: c, key: "k", fence: 1, session: 7, ttl: ttl, grace: c.grace,
		lost: make(chan struct{}), done: make(chan struct{})}
	start := time.Now()
	g.credit(start, start)
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	go g.keepAlive()
	t.Cleanup(func() {
		g.stop()
		<-g.done
	})
	eventually(t, 30*time.Second, "a late answer sent", func() bool { return indexOf(s.seen(), "late 1") >= 0 })
	select {
	case <-g.Lost():
	case <-time.After(30 * time.Second):
		t.Fatalf("not lost within 30 s of a 3 s TTL although no answer came within its ask's wait (events %v, Valid %v, TTL count ends in %v): late answers were credited",
			s.seen(), g.Valid(), time.Until(g.ttlCountEnd()).Round(time.Millisecond))
	}
	t.Logf("lost %v after the last timely answer; events %v", time.Since(start).Round(time.Millisecond), s.seen())
}
