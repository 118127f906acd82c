// Lock holders of the Go client for scripts/soak-clients.sh: -holders
// goroutines share one Client at its defaults (TTL 10 s, grace 750 ms);
// each takes a lock of its own and holds it for -duration, looking every
// 100 ms at Valid() and Lost(). A poll that finds the lock not valid (and
// not lost) starts a jeopardy episode, the next that finds it valid ends
// it, so an episode is timed to about a poll. Prints an event line on
// stderr as it happens and one RESULT line per holder on stdout at the end.
//
//	go build -o holder . && ./holder -endpoints HOST:PORT,... -holders 20 -duration 600s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"example.invalid/raftlock/client/go/raftlock"
)

const poll = 100 * time.Millisecond

func logf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// tally counts what the polls of one holder saw.
type tally struct {
	name           string
	lost           bool
	episodes       int
	total, longest time.Duration
	since          time.Time // start of the jeopardy episode under way (zero: none)
}

func (t *tally) observe(now time.Time, valid, lost bool) {
	switch {
	case lost && !t.lost:
		t.lost = true
		t.end(now)
		logf("%s LOST", t.name)
	case lost:
	case !valid && t.since.IsZero():
		t.since = now
		t.episodes++
		logf("%s jeopardy", t.name)
	case valid && !t.since.IsZero():
		d := t.end(now)
		logf("%s held again after %.3f s", t.name, d.Seconds())
	}
}

// end closes the episode under way, if any, at now.
func (t *tally) end(now time.Time) time.Duration {
	if t.since.IsZero() {
		return 0
	}
	d := now.Sub(t.since)
	t.total += d
	if d > t.longest {
		t.longest = d
	}
	t.since = time.Time{}
	return d
}

func hold(c *raftlock.Client, name string, duration time.Duration, onLost *int64) string {
	t := &tally{name: name}
	fail := func(err error) string {
		return fmt.Sprintf("RESULT client=go name=%s lost=%d on_lost=%d jeopardy=%d jeopardy_total=%.3f jeopardy_longest=%.3f held_at_end=0 error=%q",
			name, b2i(t.lost), atomic.LoadInt64(onLost), t.episodes, t.total.Seconds(), t.longest.Seconds(), err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	g, err := c.Acquire(ctx, name, raftlock.AcquireOptions{})
	cancel()
	if err != nil {
		return fail(fmt.Errorf("acquire: %w", err))
	}
	lostNow := func() bool {
		select {
		case <-g.Lost():
			return true
		default:
			return false
		}
	}
	end := time.Now().Add(duration)
	for time.Now().Before(end) {
		time.Sleep(poll)
		t.observe(time.Now(), g.Valid(), lostNow())
	}
	// Held at the end: valid by the client's count (a jeopardy episode
	// under way may end within 5 s) and the fence current on the cluster.
	for wait := time.Now().Add(5 * time.Second); !t.since.IsZero() && !t.lost && time.Now().Before(wait); {
		time.Sleep(poll)
		t.observe(time.Now(), g.Valid(), lostNow())
	}
	valid, lost := g.Valid(), lostNow()
	t.observe(time.Now(), valid, lost)
	t.end(time.Now())
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	current, err := c.CheckFence(ctx, name, g.Fence())
	held := valid && !lost && err == nil && current
	errText := ""
	if err != nil {
		errText = "check fence: " + err.Error()
	} else if !current {
		errText = "the cluster says the fence is not current"
	}
	if err := g.Unlock(ctx); err != nil && errText == "" {
		errText = "unlock: " + err.Error()
	}
	return fmt.Sprintf("RESULT client=go name=%s lost=%d on_lost=%d jeopardy=%d jeopardy_total=%.3f jeopardy_longest=%.3f held_at_end=%d error=%q",
		name, b2i(t.lost), atomic.LoadInt64(onLost), t.episodes, t.total.Seconds(), t.longest.Seconds(), b2i(held), errText)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func main() {
	endpoints := flag.String("endpoints", "", "the nodes, comma-separated")
	holders := flag.Int("holders", 20, "how many locks to hold")
	duration := flag.Duration("duration", 600*time.Second, "how long each is held")
	prefix := flag.String("prefix", "soak/go/", "lock names are PREFIX0, PREFIX1, ...")
	flag.Parse()

	onLost := make([]int64, *holders)
	index := map[string]int{}
	for i := range onLost {
		index[fmt.Sprintf("%s%d", *prefix, i)] = i
	}
	c, err := raftlock.New(*endpoints, raftlock.Options{OnLost: func(key string, fence uint64) {
		logf("%s OnLost (fence %d)", key, fence)
		atomic.AddInt64(&onLost[index[key]], 1)
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	results := make([]string, *holders)
	var wg sync.WaitGroup
	for i := 0; i < *holders; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i] = hold(c, fmt.Sprintf("%s%d", *prefix, i), *duration, &onLost[i])
		}(i)
	}
	wg.Wait()
	for _, r := range results {
		fmt.Println(r)
	}
}
