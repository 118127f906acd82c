package raftlock

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// loseUpgradeAnswers sends every request on, but throws away the answer
// to each Upgrade and reports a transport error instead: the node applies
// the upgrade, and the client never learns how it went.
type loseUpgradeAnswers struct {
	next http.RoundTripper
	lost atomic.Int32
}

func (l *loseUpgradeAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.next.RoundTrip(req)
	if err != nil || !strings.HasSuffix(req.URL.Path, "/v1/locks/Upgrade") {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	l.lost.Add(1)
	return nil, errors.New("test: the answer to this Upgrade was lost")
}

func loseUpgrades(t *testing.T, endpoints string) (*Client, *loseUpgradeAnswers) {
	lose := &loseUpgradeAnswers{next: &http.Transport{DisableCompression: true}}
	return newClient(t, endpoints, Options{RetryTimeout: 2 * time.Second, HTTPClient: &http.Client{Transport: lose}}), lose
}

// upgradeUnanswered tries an upgrade of r whose every answer lose throws
// away, and checks that it failed and that an answer was indeed lost.
func upgradeUnanswered(t *testing.T, ctx context.Context, r *Guard, lose *loseUpgradeAnswers) {
	t.Helper()
	if err := r.Upgrade(ctx, true); err == nil {
		t.Fatal("Upgrade succeeded although its every answer was lost")
	}
	if lose.lost.Load() == 0 {
		t.Fatal("no Upgrade answer was lost: the test did not do what it says")
	}
}

// An upgrade the node granted but whose answer never came: the client
// withdraws it with Cancel, which releases the exclusive grant, and the
// shared one ended with the upgrade. The guard holds nothing, so it must
// not say it does (Valid false), and a second Upgrade is refused.
func TestAnUpgradeGrantedButUnansweredLeavesTheGuardNotValid(t *testing.T) {
	cl := shared(t)
	c, lose := loseUpgrades(t, cl.endpoints())
	k := key(t)
	ctx := ctxFor(t, 60*time.Second)
	r, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	upgradeUnanswered(t, ctx, r, lose)
	if d := describe(t, c, k); d.Exists && len(d.Info.Holders) != 0 {
		t.Fatalf("after the withdrawn upgrade: %+v, want nobody holding %s (Cancel releases the granted upgrade)", d, k)
	}
	if r.Valid() {
		t.Fatal("Valid() is true, but the guard's grant ended: the upgrade was granted and then released by its Cancel")
	}
	if err := r.Upgrade(ctx, true); err == nil {
		t.Fatal("a second Upgrade of a guard whose grant ended succeeded")
	}
}

// The other side: an upgrade that was not granted (another reader, try)
// and whose answer was lost. Its Cancel withdraws nothing and the read is
// still held: the guard stays valid.
func TestAnUpgradeRefusedButUnansweredKeepsTheRead(t *testing.T) {
	cl := shared(t)
	c, lose := loseUpgrades(t, cl.endpoints())
	k := key(t)
	ctx := ctxFor(t, 60*time.Second)
	other, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	r, err := c.Acquire(ctx, k, AcquireOptions{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	upgradeUnanswered(t, ctx, r, lose)
	if d := describe(t, c, k); len(d.Info.Holders) != 2 {
		t.Fatalf("after the lost answer: %+v, want both reads held", d)
	}
	eventually(t, 10*time.Second, "the read valid", r.Valid)
	if !r.Shared() {
		t.Fatal("the guard is no longer shared")
	}
}
