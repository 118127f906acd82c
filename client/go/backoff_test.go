package raftlock

import (
	"testing"
	"time"
)

// The pause after every node failed in a row grows from 20 ms to 200 ms,
// as in every raftlock client (the seed-user walk of 2026-11-29 found it
// reaching 1.6 s where the README said 1 s), and stays there.
func TestBackoffGrowsFrom20msTo200ms(t *testing.T) {
	b := firstBackoff
	if b != 20*time.Millisecond {
		t.Fatalf("first backoff %v", b)
	}
	seen := []time.Duration{b}
	for i := 0; i < 10; i++ {
		b = nextBackoff(b)
		seen = append(seen, b)
		if b > 200*time.Millisecond {
			t.Fatalf("backoff %v past 200 ms: %v", b, seen)
		}
	}
	if b != 200*time.Millisecond {
		t.Fatalf("backoff settles at %v, not 200 ms: %v", b, seen)
	}
}
