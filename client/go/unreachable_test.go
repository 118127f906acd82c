package raftlock

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// Endpoints where nothing listens, or whose names do not resolve, cannot
// have taken the request: the client gives up at once (once every
// endpoint failed three rounds in a row), as the Rust and Python clients
// do, instead of retrying for RetryTimeout (the seed-user walk of
// 2026-11-29 waited out the whole retry timeout). "At once" here is far
// above the tenth of a second it takes, and under the 15 s timeout.
func TestRefusedAndUnresolvableEndpointsFailFast(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	for _, eps := range []string{"no-such-host.invalid:7101", closed, "no-such-host.invalid:7101," + closed} {
		c, err := New(eps, Options{})
		if err != nil {
			t.Fatal(err)
		}
		started := time.Now()
		_, _, err = c.TryLock(context.Background(), key(t))
		took := time.Since(started)
		t.Logf("%s: gave up after %v: %v", eps, took, err)
		if !IsCode(err, "UNAVAILABLE") || !strings.Contains(err.Error(), "no node accepts connections") {
			t.Fatalf("%s: want UNAVAILABLE, no node accepts connections; got %v", eps, err)
		}
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("%s: want an error that is ErrUnreachable; got %v", eps, err)
		}
		if strings.Contains(eps, "invalid") && !strings.Contains(err.Error(), "no-such-host.invalid:7101: the name does not resolve") {
			t.Fatalf("%s: the error names the endpoint and why: %v", eps, err)
		}
		if took > 12*time.Second {
			t.Fatalf("%s: gave up after %v", eps, took)
		}
	}
}

// Only the client's own "nothing was sent" error is ErrUnreachable: a
// node's UNAVAILABLE answer (no leader, a leader without its quorum) is not.
func TestOnlyTheUnsentErrorIsUnreachable(t *testing.T) {
	answered := &Error{Code: "UNAVAILABLE", Message: "no leader", HTTPStatus: 503}
	if errors.Is(answered, ErrUnreachable) {
		t.Fatalf("a node's answer is not ErrUnreachable: %v", answered)
	}
	if errors.Is(errors.New("raftlock: no node accepts connections"), ErrUnreachable) {
		t.Fatal("an error with the same text is not ErrUnreachable")
	}
}
