package raftlock

// Worker processes for the tests that pause or kill a lock's holder or
// waiter: the test binary run again with childModeEnv set, printing one
// line per event on stdout.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

const childModeEnv = "RAFTLOCK_GO_TEST_CHILD"

func childMain(mode string) int {
	ttl, err := time.ParseDuration(os.Getenv("RAFTLOCK_TTL"))
	if err != nil {
		fmt.Println("ERROR ttl:", err)
		return 2
	}
	opts := Options{TTL: ttl}
	if g := os.Getenv("RAFTLOCK_GRACE"); g != "" {
		if opts.EndOnDisconnect, err = time.ParseDuration(g); err != nil {
			fmt.Println("ERROR grace:", err)
			return 2
		}
	}
	c, err := New(os.Getenv("RAFTLOCK_ENDPOINTS"), opts)
	if err != nil {
		fmt.Println("ERROR new:", err)
		return 2
	}
	key := os.Getenv("RAFTLOCK_KEY")
	switch mode {
	case "hold":
		// Hold key; report a loss (and that the work's context is not
		// cancelled); release when stdin says so. With
		// RAFTLOCK_SAY_RENEWED set, also say when the first renewal
		// was confirmed.
		err := c.LockAndDo(context.Background(), key, func(ctx context.Context) error {
			g := GuardFrom(ctx)
			fmt.Printf("HOLD fence %d\n", g.Fence())
			if os.Getenv("RAFTLOCK_SAY_RENEWED") != "" {
				// Once a renewal over the keep-alive stream was
				// confirmed (the lease end moved).
				first := g.LeaseEnd()
				for g.LeaseEnd().Equal(first) {
					time.Sleep(5 * time.Millisecond) // polling interval
				}
				fmt.Println("RENEWED")
			}
			go func() {
				<-g.Lost()
				fmt.Printf("LOST valid=%v ctx=%v\n", g.Valid(), ctx.Err())
			}()
			line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
			fmt.Printf("WORK %s ctx=%v\n", strings.TrimSpace(line), ctx.Err())
			return nil
		})
		fmt.Printf("RELEASED err=%v\n", err)
	case "wait":
		fmt.Println("WAITING")
		release, err := c.Lock(context.Background(), key)
		if err != nil {
			fmt.Println("ERROR lock:", err)
			return 1
		}
		fmt.Println("HOLD")
		release()
	case "waitall":
		// AcquireAll of key alone: say whether the grant came back held
		// (Valid) or in jeopardy, and whether it turned Valid within 10 s.
		fmt.Println("WAITING")
		m, err := c.AcquireAll(context.Background(), []Spec{{Key: key}}, AcquireOptions{})
		if err != nil {
			fmt.Println("ERROR acquireall:", err)
			return 1
		}
		fmt.Printf("HOLD valid=%v\n", m.Valid())
		deadline := time.Now().Add(10 * time.Second)
		for !m.Valid() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling interval
		}
		fmt.Printf("VALID %v\n", m.Valid())
		m.Release()
	default:
		fmt.Println("ERROR mode", mode)
		return 2
	}
	return 0
}

type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

// spawn runs a worker process in mode on key, with the client's default
// EndOnDisconnect.
func spawn(t *testing.T, mode, endpoints, key string, ttl time.Duration) *child {
	t.Helper()
	return spawnWith(t, mode, endpoints, key, ttl, 0)
}

// spawnWith is spawn with Options.EndOnDisconnect = grace (0: the
// default), and extra environment variables.
func spawnWith(t *testing.T, mode, endpoints, key string, ttl, grace time.Duration, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...),
		childModeEnv+"="+mode,
		"RAFTLOCK_ENDPOINTS="+endpoints,
		"RAFTLOCK_KEY="+key,
		"RAFTLOCK_TTL="+ttl.String(),
	)
	if grace != 0 {
		cmd.Env = append(cmd.Env, "RAFTLOCK_GRACE="+grace.String())
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 64)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			ch.lines <- s.Text()
		}
		close(ch.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return ch
}

// expect waits for the worker's next line and checks its start.
func (ch *child) expect(prefix string, within time.Duration) string {
	ch.t.Helper()
	select {
	case line, ok := <-ch.lines:
		if !ok {
			ch.t.Fatalf("the worker ended before printing %q", prefix)
		}
		if !strings.HasPrefix(line, prefix) {
			ch.t.Fatalf("the worker printed %q, want a line starting %q", line, prefix)
		}
		return line
	case <-time.After(within):
		ch.t.Fatalf("the worker printed nothing within %v (want %q)", within, prefix)
	}
	return ""
}

func (ch *child) signal(sig syscall.Signal) {
	ch.t.Helper()
	if err := ch.cmd.Process.Signal(sig); err != nil {
		ch.t.Fatalf("signal %v: %v", sig, err)
	}
}
