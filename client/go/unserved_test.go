package raftlock

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// standInServer answers every request with status and body, counting them.
type standInServer struct {
	*httptest.Server
	asked atomic.Int64
}

func newStandInServer(t *testing.T, status int, contentType, body string) *standInServer {
	t.Helper()
	s := &standInServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.asked.Add(1)
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s
}

// Endpoints that do not serve the call: another HTTP service on a dead
// node's port (its 404 page), a raftlock without this route (an older
// version during an upgrade: 404 "no route"), a server answering 501.
// Nothing was done there, so the client asks the other endpoints, as the
// Rust client does with UNIMPLEMENTED.
func unservingStandIns(t *testing.T) []*standInServer {
	return []*standInServer{
		newStandInServer(t, http.StatusNotFound, "text/plain; charset=utf-8", "404 page not found\n"),
		newStandInServer(t, http.StatusNotFound, "application/json", `{"code":"NOT_FOUND","message":"no route POST /v1/locks/Lock"}`),
		newStandInServer(t, http.StatusNotImplemented, "text/html", "<html>501 Not Implemented</html>"),
	}
}

func TestAnEndpointThatDoesNotServeTheCallIsPassedOver(t *testing.T) {
	cl := shared(t)
	standIns := unservingStandIns(t)
	var eps []string
	for _, s := range standIns {
		eps = append(eps, s.URL)
	}
	eps = append(eps, cl.endpoints())
	c := newClient(t, strings.Join(eps, ","), Options{})
	ok, release, err := c.TryLock(ctxFor(t, 30*time.Second), key(t))
	if err != nil || !ok {
		t.Fatalf("with endpoints that do not serve the call first: %v %v, want the lock", ok, err)
	}
	release()
	for i, s := range standIns {
		if s.asked.Load() == 0 {
			t.Fatalf("stand-in %d was never asked: the test does not test the pass-over", i)
		}
	}
	leader := c.currentLeader()
	for _, s := range standIns {
		if leader == s.URL {
			t.Fatalf("the client took %s, which does not serve the call, for the leader", leader)
		}
	}
}

// When no endpoint serves the call, it fails with UNIMPLEMENTED once each
// has answered so, naming each, without waiting for the retry timeout
// (RetryTimeout here is longer than the context's deadline).
func TestNoEndpointServesTheCallFailsWithUnimplemented(t *testing.T) {
	standIns := unservingStandIns(t)
	var eps []string
	for _, s := range standIns {
		eps = append(eps, s.URL)
	}
	c := newClient(t, strings.Join(eps, ","), Options{RetryTimeout: 10 * time.Minute})
	ok, _, err := c.TryLock(ctxFor(t, 60*time.Second), key(t))
	if ok || !IsCode(err, "UNIMPLEMENTED") {
		t.Fatalf("with no endpoint serving the call: %v %v, want UNIMPLEMENTED", ok, err)
	}
	for _, s := range standIns {
		if !strings.Contains(err.Error(), s.URL) {
			t.Fatalf("the error does not name %s: %v", s.URL, err)
		}
		if n := s.asked.Load(); n != 1 {
			t.Fatalf("%s was asked %d times, want once", s.URL, n)
		}
	}
}

// A raftlock answer of NOT_FOUND that is not "no route" (a session that
// is gone) is the cluster's answer: returned at once, the others not asked.
func TestASessionNotFoundIsNotPassedOver(t *testing.T) {
	gone := newStandInServer(t, http.StatusNotFound, "application/json", `{"code":"NOT_FOUND","message":"session 7 not found"}`)
	other := newStandInServer(t, http.StatusNotFound, "text/plain", "404 page not found\n")
	c := newClient(t, gone.URL+","+other.URL, Options{})
	_, _, err := c.TryLock(ctxFor(t, 60*time.Second), key(t))
	if !IsCode(err, "NOT_FOUND") || !strings.Contains(err.Error(), "session 7 not found") {
		t.Fatalf("a session-not-found answer: %v, want it as the error", err)
	}
	if n := other.asked.Load(); n != 0 {
		t.Fatalf("the other endpoint was asked %d times after the cluster answered", n)
	}
}
