package raftlock

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	mathrand "math/rand"
	"net/http"
	"sync"
	"time"
)

// keepAliveLine is one line of a streaming KeepAlive's answer: an answer,
// or an error that ends the stream.
type keepAliveLine struct {
	keepAliveResponse
	Code   string `json:"code"`
	Leader string `json:"leader"`
}

// keepAliveStreamed renews the guard's session over one streaming
// KeepAlive at a time (HTTP, newline-delimited JSON), at once and then a
// third of the span after the last confirmed send. The stream carries the
// session: when the process dies its connection closes, and the leader
// ends the session a grace later, unless another stream renews it. It
// moves to the next node when a stream fails (at once to a leader a node
// names; otherwise after a pause of 20 ms doubling to 200 ms, each drawn
// from 0.5 to 1.5 times that, back to 20 ms once a renewal is answered),
// and when an ask goes unanswered for silence(): then the silent stream
// stays open until a newer one has renewed the session (closing it first
// would start the grace with no stream renewing it); if the newer one goes
// silent too, the oldest silent stream is the one kept open. It goes on
// through jeopardy (the grace count ran out: Valid is false until a
// renewal is answered), and marks the lock lost, and stops, once the TTL
// count runs out with no renewal answered, or when the node answers that
// the session is gone.
func (g *Guard) keepAliveStreamed() {
	defer close(g.done)
	var silent *kaStream // a silent stream left open until a newer one renews
	defer func() {
		if silent != nil {
			silent.end()
		}
	}()
	target, hints, backoff := "", 0, firstBackoff
	for {
		if g.stopCtx.Err() != nil {
			return
		}
		if g.lostNow() {
			g.markLost()
			return
		}
		if target == "" {
			if target = g.c.currentLeader(); target == "" {
				target = g.c.forget("")
			}
		}
		s := g.startStream(target)
		renewed, quiet := s.renewed, s.silent
		var silentDone <-chan struct{}
		if silent != nil {
			silentDone = silent.done
		}
		wentSilent := false
	watch:
		for {
			select {
			case <-g.stopCtx.Done():
				s.end()
				return
			case <-renewed:
				renewed, backoff, hints = nil, firstBackoff, 0
				if silent != nil {
					silent.end()
					silent, silentDone = nil, nil
				}
			case <-silentDone:
				if silent.expired {
					s.end()
					g.markLost()
					return
				}
				silent, silentDone = nil, nil
			case <-quiet:
				// Left open: it may still renew the session (its answers
				// count) while the next stream is tried. If an older
				// silent stream is still open (nothing renewed since it
				// went silent), that one stays: it carried the session,
				// and closing it would start the grace with no stream
				// renewing it; this newer one, which renewed nothing,
				// is closed instead.
				if silent != nil {
					s.end()
				} else {
					silent = s
				}
				wentSilent = true
				break watch
			case <-s.done:
				if s.expired {
					g.markLost()
					return
				}
				break watch
			}
		}
		if g.stopCtx.Err() != nil {
			return
		}
		if !wentSilent && s.hint != "" && s.hint != target && hints <= len(g.c.endpoints) {
			target, hints = s.hint, hints+1
			continue
		}
		target, hints = g.c.forget(target), 0
		pause := time.Duration(mathrand.Int63n(int64(backoff))) + backoff/2
		backoff = nextBackoff(backoff)
		if !g.sleepUntil(time.Now().Add(pause)) {
			return
		}
	}
}

// silence is how long an ask may go unanswered before the keep-alive
// tries a stream to another node: the grace (at most a third of the TTL),
// and at least a second. An answer that comes later is not credited.
func (g *Guard) silence() time.Duration {
	d := g.grace
	if d > g.ttl/3 {
		d = g.ttl / 3
	}
	if d < time.Second {
		d = time.Second
	}
	return d
}

// kaStream is one streaming KeepAlive, run by startStream.
type kaStream struct {
	cancel  context.CancelFunc
	done    chan struct{} // closed when it has ended; expired and hint are set then
	expired bool          // the node answered that the session is gone
	hint    string        // the leader a node named instead of answering
	renewed chan struct{} // closed at its first answered renewal
	silent  chan struct{} // closed when an ask went unanswered for silence()
}

// end closes the stream and waits for it to end.
func (s *kaStream) end() {
	s.cancel()
	<-s.done
}

// startStream runs one streaming KeepAlive at base until it fails, the
// lock is lost or the stream is ended.
func (g *Guard) startStream(base string) *kaStream {
	ctx, cancel := context.WithCancel(g.stopCtx)
	s := &kaStream{cancel: cancel, done: make(chan struct{}), renewed: make(chan struct{}), silent: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.expired, s.hint = g.stream(ctx, cancel, base, s)
	}()
	return s
}

// stream runs the streaming KeepAlive of s at base until it fails, the
// lock is lost or ctx ends. It reports whether the node answered that the
// session is gone, and the leader a node named instead of answering.
func (g *Guard) stream(ctx context.Context, cancel context.CancelFunc, base string, s *kaStream) (expired bool, hint string) {
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/locks/KeepAlive", pr)
	if err != nil {
		return false, ""
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	if g.c.token != "" {
		req.Header.Set("Authorization", "Bearer "+g.c.token)
	}
	var (
		mu    sync.Mutex
		asked = map[uint64]time.Time{} // ask id -> send time
	)
	// The pipe's writer. A write blocks until the transport reads the
	// request body, which it does only once the connection (and its TLS
	// handshake) is up: with an HTTPClient without dial or handshake
	// timeouts that may be never. So the timers below never wait on a
	// write: they hand each ask to this goroutine. Its end closes the
	// request body: a round trip that failed waits for that (net/http
	// finishes writing the body first), and so does one cancelled.
	toWrite := make(chan []byte, 16)
	go func() {
		defer pw.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case line := <-toWrite:
				if _, err := pw.Write(line); err != nil {
					return
				}
			}
		}
	}()
	// The timers: an ask at once, then one a third of the span after the
	// last confirmed send (or a sixth of it after an ask still unanswered:
	// so every sixth of the span in jeopardy). Once the TTL count runs out
	// they end the stream (the lock is lost).
	go func() {
		quiet := false
		for {
			id := g.c.asks.Add(1)
			line, _ := json.Marshal(keepAliveRequest{SessionID: u64(g.session), AskID: u64(id)})
			select {
			case toWrite <- append(line, '\n'):
				mu.Lock()
				asked[id] = time.Now()
				mu.Unlock()
			default:
				// The writer is stuck on earlier asks (they count as
				// unanswered): this one is not sent.
			}
			g.mu.Lock()
			due, end := g.lastSent.Add(g.span()/3), g.ttlEnd
			g.mu.Unlock()
			if soonest := time.Now().Add(g.span() / 6); due.Before(soonest) {
				due = soonest
			}
			if end.Before(due) {
				due = end
			}
			t := time.NewTimer(time.Until(due))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if g.lostNow() {
				cancel()
				return
			}
			// An ask unanswered for silence(): the node may have lost
			// its quorum or stopped (the connection still up), or be slow.
			// Say so once (the keep-alive tries another stream, and closes
			// this one only once that one renewed); asks go on here.
			mu.Lock()
			stale := false
			for _, at := range asked {
				stale = stale || time.Since(at) > g.silence()
			}
			mu.Unlock()
			if stale && !quiet {
				quiet = true
				close(s.silent)
			}
		}
	}()
	resp, err := g.c.http.Do(req)
	if err != nil {
		return false, ""
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_, leader := parseError(attempt{status: resp.StatusCode, header: resp.Header, body: body})
		if h := resp.Header.Get(leaderHeader); h != "" {
			leader = h
		}
		if leader != "" {
			return false, schemeOf(base) + "://" + leader
		}
		return false, ""
	}
	renewed := false
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 4096), 64<<10)
	for lines.Scan() {
		var l keepAliveLine
		if err := json.Unmarshal(lines.Bytes(), &l); err != nil {
			return false, ""
		}
		if l.Code != "" {
			if l.Leader != "" {
				return false, schemeOf(base) + "://" + l.Leader
			}
			return false, ""
		}
		mu.Lock()
		sent, ok := asked[uint64(l.AskID)]
		delete(asked, uint64(l.AskID))
		mu.Unlock()
		if !ok || uint64(l.SessionID) != g.session {
			// Not the answer to an ask of this stream: never credit it.
			continue
		}
		if l.Expired {
			return true, ""
		}
		if !g.creditRenewal(sent, time.Now(), g.silence()) {
			// Later than its ask's wait (the stream was taken for
			// silent), or past the TTL count: not credited.
			continue
		}
		g.c.setLeader(base)
		if !renewed {
			renewed = true
			close(s.renewed)
		}
	}
	return false, ""
}
