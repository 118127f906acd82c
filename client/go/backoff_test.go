package raftlock

import (
	"testing"
	"time"
)

// The pause after every node failed in a row grows from 50 ms to 1 s, as
// the README says (the seed-user walk of 2026-11-29 found it reaching
// 1.6 s), and stays there.
func TestBackoffGrowsFrom50msTo1s(t *testing.T) {
	b := firstBackoff
	if b != 50*time.Millisecond {
		t.Fatalf("first backoff %v", b)
	}
	seen := []time.Duration{b}
	for i := 0; i < 10; i++ {
		b = nextBackoff(b)
		seen = append(seen, b)
		if b > time.Second {
			t.Fatalf("backoff %v past 1 s: %v", b, seen)
		}
	}
	if b != time.Second {
		t.Fatalf("backoff settles at %v, not 1 s: %v", b, seen)
	}
}
