package raftlock

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
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
// ends the session a grace later. It moves to the next node when a stream
// fails (at once to a leader a node names), and goes on through jeopardy
// (the grace count ran out: Valid is false until a renewal is answered).
// It marks the lock lost, and stops, once the TTL count runs out with no
// renewal answered, or when the node answers that the session is gone.
func (g *Guard) keepAliveStreamed() {
	defer close(g.done)
	target, hints := "", 0
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
		expired, hint := g.stream(target)
		if expired {
			g.markLost()
			return
		}
		if g.stopCtx.Err() != nil {
			return
		}
		if hint != "" && hint != target && hints <= len(g.c.endpoints) {
			target, hints = hint, hints+1
			continue
		}
		target, hints = g.c.forget(target), 0
		if !g.sleepUntil(time.Now().Add(g.span() / 20)) {
			return
		}
	}
}

// stream runs one streaming KeepAlive at base until it fails, the lock is
// lost or the guard stops. It reports whether the node answered that the
// session is gone, and the leader a node named instead of answering.
func (g *Guard) stream(base string) (expired bool, hint string) {
	ctx, cancel := context.WithCancel(g.stopCtx)
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
	// The writer: an ask at once, then one a third of the span after the
	// last confirmed send (or a sixth of it after an ask still unanswered:
	// so every sixth of the span in jeopardy). Once the TTL count runs out
	// it ends the stream (the lock is lost). Its end closes the
	// request body: a round trip that failed waits for that (net/http
	// finishes writing the body first), and so does one cancelled.
	go func() {
		defer pw.Close()
		for {
			id := g.c.asks.Add(1)
			line, _ := json.Marshal(keepAliveRequest{SessionID: u64(g.session), AskID: u64(id)})
			mu.Lock()
			asked[id] = time.Now()
			mu.Unlock()
			if _, err := pw.Write(append(line, '\n')); err != nil {
				return
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
			// An ask unanswered for a whole span: the node may have lost
			// its quorum or stopped (the connection still up). Try the
			// next node rather than wait out the TTL count on this one.
			mu.Lock()
			stale := false
			for _, at := range asked {
				stale = stale || time.Since(at) > g.span()
			}
			mu.Unlock()
			if stale {
				cancel()
				return
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
		g.c.setLeader(base)
		g.credit(sent, time.Now())
	}
	return false, ""
}
