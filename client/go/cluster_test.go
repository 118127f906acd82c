package raftlock

// A real raftlock cluster for the tests: three `raftlockd run` processes
// on loopback ports of their own, in a temporary directory, started from
// the binary in $RAFTLOCKD (default: the workspace's target/debug/raftlockd,
// which `cargo test --workspace` builds). Nothing is mocked.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func raftlockdPath() string {
	if p := os.Getenv("RAFTLOCKD"); p != "" {
		return p
	}
	p, _ := filepath.Abs(filepath.Join("..", "..", "target", "debug", "raftlockd"))
	return p
}

type testNode struct {
	id   int
	addr string
	args []string
	cmd  *exec.Cmd
	log  *os.File
}

type testCluster struct {
	dir   string
	nodes []*testNode
	// scheme and client reach the nodes (https and a client with the
	// test CA when the nodes serve TLS).
	scheme string
	client *http.Client
}

// freePorts reserves n loopback ports by binding them all, then frees
// them for the nodes (another process could take one meanwhile: start
// retries with new ports when a node cannot listen).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startCluster starts an n-node cluster and waits until every node
// names the same leader. extra flags go to every node.
func startCluster(n int, extra ...string) (*testCluster, error) {
	return startClusterWith("http", http.DefaultClient, n, extra...)
}

// startClusterWith is startCluster for nodes reached with scheme and hc.
func startClusterWith(scheme string, hc *http.Client, n int, extra ...string) (*testCluster, error) {
	bin := raftlockdPath()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no raftlockd at %s (build it with `cargo build -p raftlock-node --bin raftlockd`, or set RAFTLOCKD): %v", bin, err)
	}
	var lastErr error
	for try := 0; try < 3; try++ {
		dir, err := os.MkdirTemp("", "raftlock-go-")
		if err != nil {
			return nil, err
		}
		c, err := startClusterIn(dir, bin, n, extra, scheme, hc)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if c != nil {
			c.stop()
		} else {
			os.RemoveAll(dir)
		}
	}
	return nil, lastErr
}

func startClusterIn(dir, bin string, n int, extra []string, scheme string, hc *http.Client) (*testCluster, error) {
	ports, err := freePorts(n)
	if err != nil {
		return nil, err
	}
	var peers []string
	for i, p := range ports {
		peers = append(peers, fmt.Sprintf("%d=127.0.0.1:%d", i+1, p))
	}
	c := &testCluster{dir: dir, scheme: scheme, client: hc}
	for i, p := range ports {
		node := &testNode{id: i + 1, addr: fmt.Sprintf("127.0.0.1:%d", p)}
		node.args = append([]string{"run",
			"--id", fmt.Sprint(node.id),
			"--listen", node.addr,
			"--data-dir", filepath.Join(dir, fmt.Sprintf("node-%d", node.id)),
			"--peers", strings.Join(peers, ","),
			"--insecure-peers",
		}, extra...)
		if i == 0 {
			node.args = append(node.args, "--init")
		}
		c.nodes = append(c.nodes, node)
	}
	// Node 1 bootstraps: start it last so its first election finds its
	// peers listening.
	for i := len(c.nodes) - 1; i >= 0; i-- {
		if err := c.startNode(c.nodes[i]); err != nil {
			return c, err
		}
	}
	if _, err := c.waitLeader(30*time.Second, 0); err != nil {
		return c, err
	}
	return c, nil
}

func (c *testCluster) startNode(n *testNode) error {
	log, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("node-%d.log", n.id)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(raftlockdPath(), n.args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "RUST_LOG=warn")
	// The node dies with the test binary, even if the test panics.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	n.cmd, n.log = cmd, log
	return nil
}

// endpoints lists every node, comma-separated.
func (c *testCluster) endpoints() string {
	var eps []string
	for _, n := range c.nodes {
		eps = append(eps, c.scheme+"://"+n.addr)
	}
	return strings.Join(eps, ",")
}

type statusResponse struct {
	ID         u64    `json:"id"`
	Role       string `json:"role"`
	LeaderID   u64    `json:"leader_id"`
	LeaderAddr string `json:"leader_addr"`
}

// status asks one node (directly, no leader following) for its view.
func (c *testCluster) status(addr string) (statusResponse, error) {
	var s statusResponse
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.scheme+"://"+addr+"/v1/cluster/Status", bytes.NewReader(nil))
	resp, err := c.client.Do(req)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return s, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitLeader polls until every running node names the same leader, other
// than node `not` (0: any), and returns it.
func (c *testCluster) waitLeader(within time.Duration, not int) (*testNode, error) {
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		for _, n := range c.nodes {
			if n.cmd != nil && n.cmd.ProcessState != nil {
				return nil, fmt.Errorf("node %d exited: %v (log: %s)", n.id, n.cmd.ProcessState, c.logOf(n))
			}
		}
		leader := ""
		agree := true
		for _, n := range c.nodes {
			if n.cmd == nil {
				continue
			}
			s, err := c.status(n.addr)
			if err != nil {
				last = fmt.Sprintf("node %d: %v", n.id, err)
				agree = false
				break
			}
			if s.LeaderAddr == "" || (leader != "" && s.LeaderAddr != leader) {
				last = fmt.Sprintf("node %d sees leader %q", n.id, s.LeaderAddr)
				agree = false
				break
			}
			leader = s.LeaderAddr
		}
		if agree && leader != "" {
			for _, n := range c.nodes {
				if n.addr == leader && n.id != not {
					return n, nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond) // polling interval, under the deadline
	}
	return nil, fmt.Errorf("no agreed leader within %v (last: %s)", within, last)
}

func (c *testCluster) logOf(n *testNode) string {
	b, _ := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("node-%d.log", n.id)))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// kill SIGKILLs one node.
func (c *testCluster) kill(n *testNode) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Kill()
	_ = n.cmd.Wait()
	n.log.Close()
	n.cmd = nil
}

func (c *testCluster) stop() {
	for _, n := range c.nodes {
		c.kill(n)
	}
	os.RemoveAll(c.dir)
}

// The cluster most tests share, started by the first test that needs it
// and stopped by TestMain.
var (
	sharedOnce    sync.Once
	sharedCluster *testCluster
	sharedErr     error
)

func shared(t *testing.T) *testCluster {
	t.Helper()
	sharedOnce.Do(func() { sharedCluster, sharedErr = startCluster(3) })
	if sharedErr != nil {
		t.Fatalf("starting the test cluster: %v", sharedErr)
	}
	return sharedCluster
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(childModeEnv); mode != "" {
		os.Exit(childMain(mode))
	}
	code := m.Run()
	if sharedCluster != nil {
		sharedCluster.stop()
	}
	os.Exit(code)
}

// eventually polls cond every 20 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval, under the deadline
	}
}

type describeRequest struct {
	Name string `json:"name"`
}

type holderInfo struct {
	SessionID u64    `json:"session_id"`
	Fence     u64    `json:"fence"`
	Mode      string `json:"mode"`
}

type waiterInfo struct {
	SessionID u64 `json:"session_id"`
}

type describeResponse struct {
	Exists bool `json:"exists"`
	Info   struct {
		Holders []holderInfo `json:"holders"`
		Waiters []waiterInfo `json:"waiters"`
	} `json:"info"`
}

// describe reads key's holders and waiters (linearizable, at the leader).
func describe(t *testing.T, c *Client, key string) describeResponse {
	t.Helper()
	var d describeResponse
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.call(ctx, "locks/Describe", describeRequest{Name: key}, &d, c.attemptTimeout()); err != nil {
		t.Fatalf("describe %q: %v", key, err)
	}
	return d
}
