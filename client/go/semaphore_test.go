package raftlock

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Semaphore fields are checked as the node checks them, before anything
// is sent (no node listens on the endpoint).
func TestSemaphoreOptionsAreCheckedBeforeSending(t *testing.T) {
	c := newClient(t, "127.0.0.1:1", Options{RetryTimeout: 100 * time.Millisecond})
	ctx := ctxFor(t, 10*time.Second)
	for _, tc := range []struct {
		o    AcquireOptions
		says string
	}{
		{AcquireOptions{Weight: 1}, "without a Capacity"},
		{AcquireOptions{Capacity: 3, Shared: true}, "no shared mode"},
		{AcquireOptions{Capacity: MaxCapacity + 1}, "capacity must be 1..=1000000, got 1000001"},
		{AcquireOptions{Capacity: 3, Weight: 4}, "weight must be 1..=3, got 4"},
		{AcquireOptions{Capacity: 3, Weight: 4, Try: true}, "weight must be 1..=3, got 4"},
	} {
		_, err := c.Acquire(ctx, "sem", tc.o)
		if !IsCode(err, "INVALID_ARGUMENT") || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: %v, want INVALID_ARGUMENT saying %q", tc.o, err, tc.says)
		}
	}
	if _, err := c.AcquireAll(ctx, []Spec{{Key: "sem"}}, AcquireOptions{Capacity: 3}); !IsCode(err, "INVALID_ARGUMENT") {
		t.Errorf("AcquireAll with a Capacity: %v, want INVALID_ARGUMENT", err)
	}
}

func TestSemaphorePermitsUpToTheCapacity(t *testing.T) {
	cl := shared(t)
	c := newClient(t, cl.endpoints(), Options{})
	k := key(t)
	ctx := ctxFor(t, 60*time.Second)
	a, err := c.Acquire(ctx, k, AcquireOptions{Capacity: 3, Weight: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a.Weight() != 2 || a.Capacity() != 3 || a.Shared() {
		t.Fatalf("guard of 2 permits of 3: weight %d capacity %d shared %v", a.Weight(), a.Capacity(), a.Shared())
	}
	if _, err := c.Acquire(ctx, k, AcquireOptions{Capacity: 3, Weight: 2, Try: true}); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("2 more permits of 3 with 2 held: %v, want ErrNotAcquired", err)
	}
	one, err := c.Acquire(ctx, k, AcquireOptions{Capacity: 3, Try: true}) // Weight 0: one permit
	if err != nil {
		t.Fatalf("the third permit: %v", err)
	}
	if one.Weight() != 1 {
		t.Fatalf("Weight 0 took %d permits, want 1", one.Weight())
	}
	if cur, err := c.CheckFence(ctx, k, one.Fence()); err != nil || !cur || one.Fence() <= a.Fence() {
		t.Fatalf("the third permit's fence %d (first %d): current %v, %v", one.Fence(), a.Fence(), cur, err)
	}
	if d := describe(t, c, k); len(d.Info.Holders) != 2 || len(d.Info.Waiters) != 0 {
		t.Fatalf("two holders of the semaphore, none waiting: %+v", d)
	}
	// The node refuses another capacity, and a lock of a semaphore's name.
	if _, err := c.Acquire(ctx, k, AcquireOptions{Capacity: 4, Try: true}); !IsCode(err, "FAILED_PRECONDITION") {
		t.Fatalf("a permit of capacity 4 from a semaphore of 3: %v, want FAILED_PRECONDITION", err)
	}
	if _, err := c.Acquire(ctx, k, AcquireOptions{Try: true}); !IsCode(err, "FAILED_PRECONDITION") {
		t.Fatalf("a lock of a semaphore's name: %v, want FAILED_PRECONDITION", err)
	}
	// A semaphore guard is not a lock: no downgrade, no upgrade, nothing sent.
	if err := a.Downgrade(ctx); err == nil || !strings.Contains(err.Error(), "only an exclusive lock") {
		t.Fatalf("Downgrade of permits: %v", err)
	}
	if err := a.Upgrade(ctx, true); err == nil || !strings.Contains(err.Error(), "only a shared lock") {
		t.Fatalf("Upgrade of permits: %v", err)
	}
	// Two permits wait until two are free.
	got := make(chan error, 1)
	var b *Guard
	go func() {
		var err error
		b, err = c.Acquire(ctx, k, AcquireOptions{Capacity: 3, Weight: 2})
		got <- err
	}()
	eventually(t, 10*time.Second, "two permits queued", func() bool { return len(describe(t, c, k).Info.Waiters) == 1 })
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("the waiting permits: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the waiting permits were not granted when two were free")
	}
	if b.Fence() <= one.Fence() {
		t.Fatalf("the waiter's fence %d is not above %d", b.Fence(), one.Fence())
	}
	for _, g := range []*Guard{b, one} {
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d := describe(t, c, k); len(d.Info.Holders) != 0 || len(d.Info.Waiters) != 0 {
		t.Fatalf("after every release: %+v", d)
	}
}
