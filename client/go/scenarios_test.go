package raftlock

// The Go runner of the scenarios every first-party client shares
// (../scenarios.json, read as ../scenarios.md says), against a live
// three-node cluster of its own (its last scenario kills the leader). It
// is data only: each op below is what the .md says, with no code for any
// one scenario; an op, an outcome or a field it does not know fails the
// test, and so does the first step whose outcome differs.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// scenarioFile is the shared file; $RAFTLOCK_SCENARIOS names another
// (to try the runner on a changed copy).
func scenarioFile() string {
	if p := os.Getenv("RAFTLOCK_SCENARIOS"); p != "" {
		return p
	}
	return "../scenarios.json"
}

// lockSafety bounds a lock that the file lets wait without a timeout: a
// lock still waiting then fails the step.
const lockSafety = 30 * time.Second

type scenarioDoc struct {
	About     []string   `json:"about"`
	Scenarios []scenario `json:"scenarios"`
}

type scenario struct {
	Name   string                   `json:"name"`
	Actors map[string]scenarioActor `json:"actors"`
	Steps  []json.RawMessage        `json:"steps"`
	steps  []scenarioStep           // parsed
}

type scenarioActor struct {
	TTLMs     uint64   `json:"ttl_ms"`
	Endpoints []string `json:"endpoints"`
}

// scenarioStep is one step; pointers tell a field absent from a zero.
type scenarioStep struct {
	Op              string          `json:"op"`
	Actor           string          `json:"actor"`
	Name            json.RawMessage `json:"name"`
	Mode            string          `json:"mode"`
	Capacity        *uint32         `json:"capacity"`
	Weight          *uint32         `json:"weight"`
	TimeoutMs       *uint64         `json:"timeout_ms"`
	As              string          `json:"as"`
	Grant           string          `json:"grant"`
	Expect          json.RawMessage `json:"expect"`
	FenceAbove      string          `json:"fence_above"`
	MinElapsedMs    *uint64         `json:"min_elapsed_ms"`
	MaxElapsedMs    *uint64         `json:"max_elapsed_ms"`
	WithinMs        *uint64         `json:"within_ms"`
	MessageContains *string         `json:"message_contains"`
	Holders         *int            `json:"holders"`
	Waiters         *int            `json:"waiters"`

	raw     string // the step as written, compacted
	key     string // Name, resolved
	outcome string // Expect of a lock/finish/release
	want    bool   // Expect of a check
}

// Outcomes of a lock (lock, finish) and of a release.
var lockOutcomes = map[string]bool{"granted": true, "not_acquired": true, "cancelled": true, "invalid_argument": true, "unreachable": true}

// opFields: the fields each op takes (required ones marked true).
var opFields = map[string]map[string]bool{
	"lock": {"op": true, "actor": true, "name": true, "expect": true, "mode": false, "capacity": false, "weight": false,
		"timeout_ms": false, "as": false, "fence_above": false, "min_elapsed_ms": false, "max_elapsed_ms": false, "message_contains": false},
	"start_lock": {"op": true, "actor": true, "name": true, "as": true, "mode": false, "capacity": false, "weight": false, "timeout_ms": false},
	"finish": {"op": true, "grant": true, "expect": true, "within_ms": false, "fence_above": false,
		"min_elapsed_ms": false, "max_elapsed_ms": false, "message_contains": false},
	"cancel":      {"op": true, "grant": true},
	"release":     {"op": true, "grant": true, "expect": false},
	"describe":    {"op": true, "name": true, "holders": true, "waiters": true},
	"check_fence": {"op": true, "grant": true, "expect": true},
	"check_held":  {"op": true, "grant": true, "expect": true},
	"revoke":      {"op": true, "grant": true},
	"expect_lost": {"op": true, "grant": true, "within_ms": true},
	"kill_leader": {"op": true},
}

// parseStep reads one step and checks it against what its op takes.
func parseStep(raw json.RawMessage, actors map[string]scenarioActor) (scenarioStep, error) {
	var s scenarioStep
	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return s, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return s, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, err
	}
	s.raw = compact.String()
	allowed, ok := opFields[s.Op]
	if !ok {
		return s, fmt.Errorf("unknown op %q", s.Op)
	}
	var names []string
	for f := range fields {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if _, ok := allowed[f]; !ok {
			return s, fmt.Errorf("op %s takes no %q", s.Op, f)
		}
	}
	for f, required := range allowed {
		if _, ok := fields[f]; required && !ok {
			return s, fmt.Errorf("op %s needs %q", s.Op, f)
		}
	}
	if s.Actor != "" {
		if _, ok := actors[s.Actor]; !ok {
			return s, fmt.Errorf("no actor %q in the scenario", s.Actor)
		}
	}
	switch s.Mode {
	case "", "exclusive", "shared":
	default:
		return s, fmt.Errorf("unknown mode %q", s.Mode)
	}
	if len(s.Name) > 0 {
		k, err := scenarioName(s.Name)
		if err != nil {
			return s, err
		}
		s.key = k
	}
	switch s.Op {
	case "lock", "finish", "release":
		s.outcome = "released"
		if len(s.Expect) > 0 {
			if err := json.Unmarshal(s.Expect, &s.outcome); err != nil {
				return s, fmt.Errorf("expect: %v", err)
			}
		}
		if s.Op == "release" && s.outcome != "released" || s.Op != "release" && !lockOutcomes[s.outcome] {
			return s, fmt.Errorf("unknown expect %s for op %s", s.Expect, s.Op)
		}
		if s.Op == "lock" && s.outcome == "cancelled" {
			return s, fmt.Errorf("only a started lock (start_lock, cancel, finish) can be cancelled")
		}
		if s.MessageContains != nil && s.outcome != "invalid_argument" {
			return s, fmt.Errorf("message_contains is for invalid_argument")
		}
		if s.FenceAbove != "" && s.outcome != "granted" {
			return s, fmt.Errorf("fence_above is for granted")
		}
	case "check_fence", "check_held":
		if err := json.Unmarshal(s.Expect, &s.want); err != nil {
			return s, fmt.Errorf("unknown expect %s for op %s (want true or false)", s.Expect, s.Op)
		}
	}
	return s, nil
}

// scenarioName is a step's name: a string or {"repeat": S, "times": N}.
func scenarioName(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var r struct {
		Repeat *string `json:"repeat"`
		Times  *int    `json:"times"`
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil || r.Repeat == nil || r.Times == nil || *r.Times < 0 {
		return "", fmt.Errorf("a name is a string or {\"repeat\": S, \"times\": N}, not %s", raw)
	}
	return strings.Repeat(*r.Repeat, *r.Times), nil
}

func loadScenarios(t *testing.T) []scenario {
	t.Helper()
	file := scenarioFile()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc scenarioDoc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if len(doc.Scenarios) == 0 {
		t.Fatalf("%s has no scenarios", file)
	}
	for i := range doc.Scenarios {
		sc := &doc.Scenarios[i]
		for j, raw := range sc.Steps {
			st, err := parseStep(raw, sc.Actors)
			if err != nil {
				t.Fatalf("%s: scenario %q, step[%d] %s: %v", file, sc.Name, j, bytes.TrimSpace(raw), err)
			}
			sc.steps = append(sc.steps, st)
		}
	}
	return doc.Scenarios
}

func TestScenarios(t *testing.T) {
	scenarios := loadScenarios(t)
	cl, err := startCluster(3)
	if err != nil {
		t.Fatalf("starting the scenarios' cluster: %v", err)
	}
	defer cl.stop()
	for _, sc := range scenarios {
		sc := sc
		if !t.Run(sc.Name, func(t *testing.T) { runScenario(t, cl, sc) }) {
			t.Fatalf("scenario %q failed; the scenarios after it were not run", sc.Name)
		}
	}
}

type lostNotice struct {
	key   string
	fence uint64
}

type scenarioActorState struct {
	client *Client
	err    error // New's error: every lock of the actor gives it

	mu   sync.Mutex
	lost []lostNotice // what OnLost was called with
}

func (a *scenarioActorState) noticed(key string, fence uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range a.lost {
		if n.key == key && n.fence == fence {
			return true
		}
	}
	return false
}

type scenarioGrant struct {
	actor    *scenarioActorState
	key      string
	guard    *Guard
	released bool
}

// lockResult is what one Acquire of a step gave.
type lockResult struct {
	guard   *Guard
	err     error
	elapsed time.Duration
	safety  bool // the runner's safety ended it, not the step
}

type pendingLock struct {
	actor     *scenarioActorState
	cancel    context.CancelFunc
	cancelled bool // by a cancel step
	timed     bool
	done      chan lockResult
	finished  bool
}

type scenarioRun struct {
	t       *testing.T
	cl      *testCluster
	actors  map[string]*scenarioActorState
	grants  map[string]*scenarioGrant
	pending map[string]*pendingLock
	extra   []*Guard // granted where the file did not expect it: released at the end
}

func runScenario(t *testing.T, cl *testCluster, sc scenario) {
	r := &scenarioRun{t: t, cl: cl, actors: map[string]*scenarioActorState{},
		grants: map[string]*scenarioGrant{}, pending: map[string]*pendingLock{}}
	defer r.cleanup()
	var names []string
	for name := range sc.Actors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		spec := sc.Actors[name]
		a := &scenarioActorState{}
		eps := cl.endpoints()
		if spec.Endpoints != nil {
			eps = strings.Join(spec.Endpoints, ",")
		}
		a.client, a.err = New(eps, Options{
			TTL: time.Duration(spec.TTLMs) * time.Millisecond,
			OnLost: func(key string, fence uint64) {
				a.mu.Lock()
				a.lost = append(a.lost, lostNotice{key, fence})
				a.mu.Unlock()
			},
		})
		r.actors[name] = a
	}
	for i, st := range sc.steps {
		if err := r.step(st); err != nil {
			t.Fatalf("scenario %q, step[%d] %s: %v", sc.Name, i, st.raw, err)
		}
	}
}

// cleanup gives up every wait and releases every grant still held.
func (r *scenarioRun) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range r.pending {
		if p.finished {
			continue
		}
		p.cancel()
		select {
		case res := <-p.done:
			if res.guard != nil {
				_ = res.guard.Unlock(ctx)
			}
		case <-ctx.Done():
		}
	}
	for _, g := range r.grants {
		if !g.released {
			_ = g.guard.Unlock(ctx)
		}
	}
	for _, g := range r.extra {
		_ = g.Unlock(ctx)
	}
}

func (r *scenarioRun) grant(name string) (*scenarioGrant, error) {
	g, ok := r.grants[name]
	if !ok {
		return nil, fmt.Errorf("no grant %q so far", name)
	}
	return g, nil
}

func (r *scenarioRun) step(st scenarioStep) error {
	switch st.Op {
	case "lock":
		a := r.actors[st.Actor]
		o, timed := acquireOptions(st)
		safety := lockSafety
		if st.MaxElapsedMs != nil && time.Duration(*st.MaxElapsedMs)*time.Millisecond+5*time.Second > safety {
			safety = time.Duration(*st.MaxElapsedMs)*time.Millisecond + 5*time.Second
		}
		if st.TimeoutMs != nil {
			safety += time.Duration(*st.TimeoutMs) * time.Millisecond
		}
		ctx, cancel, safetyHit := lockContext(st, safety)
		defer cancel()
		res := acquire(ctx, a, st.key, o)
		res.safety = safetyHit()
		return r.checkLock(st, st.As, a, res, timed, false)
	case "start_lock":
		if _, ok := r.pending[st.As]; ok {
			return fmt.Errorf("a lock named %q was started before", st.As)
		}
		a := r.actors[st.Actor]
		o, timed := acquireOptions(st)
		ctx, cancel, _ := lockContext(st, 0)
		p := &pendingLock{actor: a, cancel: cancel, timed: timed, done: make(chan lockResult, 1)}
		r.pending[st.As] = p
		go func() { p.done <- acquire(ctx, a, st.key, o) }()
		return nil
	case "cancel":
		p, ok := r.pending[st.Grant]
		if !ok {
			return fmt.Errorf("no started lock %q", st.Grant)
		}
		p.cancelled = true
		p.cancel()
		return nil
	case "finish":
		p, ok := r.pending[st.Grant]
		if !ok || p.finished {
			return fmt.Errorf("no started lock %q to finish", st.Grant)
		}
		within := lockSafety
		if st.WithinMs != nil {
			within = time.Duration(*st.WithinMs) * time.Millisecond
		}
		timer := time.NewTimer(within)
		defer timer.Stop()
		select {
		case res := <-p.done:
			p.finished = true
			p.cancel()
			return r.checkLock(st, st.Grant, p.actor, res, p.timed, p.cancelled)
		case <-timer.C:
			return fmt.Errorf("got no outcome within %v", within)
		}
	case "release":
		g, err := r.grant(st.Grant)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err = g.guard.Unlock(ctx)
		g.released = true
		if err != nil {
			return fmt.Errorf("want released, got %s", describeErr(err))
		}
		return nil
	case "check_fence":
		g, err := r.grant(st.Grant)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		current, err := g.actor.client.CheckFence(ctx, g.key, g.guard.Fence())
		if err != nil {
			return fmt.Errorf("CheckFence(%q, %d): %s", g.key, g.guard.Fence(), describeErr(err))
		}
		if current != st.want {
			return fmt.Errorf("CheckFence(%q, %d) answered %v", g.key, g.guard.Fence(), current)
		}
		return nil
	case "check_held":
		g, err := r.grant(st.Grant)
		if err != nil {
			return err
		}
		lost := false
		select {
		case <-g.guard.Lost():
			lost = true
		default:
		}
		// What the client believes: the grant is held and not lost. A
		// grant in jeopardy (Valid false: its grace count ran out, as
		// right after a failover, until a renewal gets through) is still
		// held and not lost.
		held := !g.released && !lost
		if held != st.want {
			return fmt.Errorf("held %v (released %v, Lost closed %v, Valid %v, lease end in %v)",
				held, g.released, lost, g.guard.Valid(), time.Until(g.guard.LeaseEnd()).Round(time.Millisecond))
		}
		return nil
	case "describe":
		return r.describe(st.key, *st.Holders, *st.Waiters)
	case "revoke":
		g, err := r.grant(st.Grant)
		if err != nil {
			return err
		}
		body := fmt.Sprintf(`{"session_id": "%d"}`, g.guard.SessionID())
		// The revoke answers when the lease of the session's last renewal
		// runs out: up to a TTL.
		return r.cl.leaderPost("cluster/RevokeSession", body, nil, 30*time.Second)
	case "expect_lost":
		g, err := r.grant(st.Grant)
		if err != nil {
			return err
		}
		within := time.Duration(*st.WithinMs) * time.Millisecond
		fence := g.guard.Fence()
		deadline := time.Now().Add(within)
		for {
			lost := false
			select {
			case <-g.guard.Lost():
				lost = true
			default:
			}
			noticed := g.actor.noticed(g.key, fence)
			if lost && noticed {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("within %v: Guard.Lost closed %v, OnLost(%q, %d) called %v", within, lost, g.key, fence, noticed)
			}
			time.Sleep(20 * time.Millisecond) // polling interval, under the deadline
		}
	case "kill_leader":
		leader, err := r.cl.waitLeader(30*time.Second, 0)
		if err != nil {
			return err
		}
		r.cl.kill(leader)
		r.t.Logf("killed the leader, node %d (%s)", leader.id, leader.addr)
		return nil
	}
	return fmt.Errorf("unknown op %q", st.Op)
}

// acquireOptions are a lock step's options, and whether it waits with a
// timeout.
func acquireOptions(st scenarioStep) (AcquireOptions, bool) {
	o := AcquireOptions{Shared: st.Mode == "shared"}
	if st.Capacity != nil {
		o.Capacity = *st.Capacity
	}
	if st.Weight != nil {
		o.Weight = *st.Weight
	}
	timed := false
	if st.TimeoutMs != nil {
		if *st.TimeoutMs == 0 {
			o.Try = true
		} else {
			timed = true
		}
	}
	return o, timed
}

// lockContext is the context of a lock step: with the step's timeout as
// its deadline, or none (the client then waits without a timeout, as the
// step says); a safety (when not 0) cancels it, and safetyHit says
// whether it did.
func lockContext(st scenarioStep, safety time.Duration) (context.Context, context.CancelFunc, func() bool) {
	ctx, cancel := context.WithCancel(context.Background())
	if st.TimeoutMs != nil && *st.TimeoutMs > 0 {
		var cancelTimeout context.CancelFunc
		ctx, cancelTimeout = context.WithTimeout(ctx, time.Duration(*st.TimeoutMs)*time.Millisecond)
		outer := cancel
		cancel = func() { cancelTimeout(); outer() }
	}
	var (
		mu  sync.Mutex
		hit bool
	)
	if safety > 0 {
		inner := cancel
		timer := time.AfterFunc(safety, func() {
			mu.Lock()
			hit = true
			mu.Unlock()
			inner()
		})
		cancel = func() { timer.Stop(); inner() }
	}
	return ctx, cancel, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return hit
	}
}

func acquire(ctx context.Context, a *scenarioActorState, key string, o AcquireOptions) lockResult {
	if a.err != nil {
		return lockResult{err: a.err}
	}
	started := time.Now()
	g, err := a.client.Acquire(ctx, key, o)
	return lockResult{guard: g, err: err, elapsed: time.Since(started)}
}

// lockOutcome names what an Acquire gave, as the file's outcomes do; ""
// when it is none of them.
func lockOutcome(res lockResult, timed, cancelled bool) string {
	err := res.err
	switch {
	case res.safety:
		return ""
	case err == nil:
		return "granted"
	case errors.Is(err, ErrNotAcquired):
		return "not_acquired"
	case timed && errors.Is(err, context.DeadlineExceeded):
		return "not_acquired"
	case cancelled && errors.Is(err, context.Canceled):
		return "cancelled"
	case IsCode(err, "INVALID_ARGUMENT"):
		return "invalid_argument"
	case errors.Is(err, ErrUnreachable):
		return "unreachable"
	}
	return ""
}

func describeErr(err error) string {
	return fmt.Sprintf("the error %q (%T)", err.Error(), err)
}

// checkLock checks a lock's outcome against the step, and keeps a grant.
func (r *scenarioRun) checkLock(st scenarioStep, as string, a *scenarioActorState, res lockResult, timed, cancelled bool) error {
	got := lockOutcome(res, timed, cancelled)
	if res.guard != nil {
		if st.outcome == "granted" && as != "" {
			if _, ok := r.grants[as]; ok {
				r.extra = append(r.extra, res.guard)
				return fmt.Errorf("the grant %q was named before", as)
			}
			r.grants[as] = &scenarioGrant{actor: a, key: res.guard.Key(), guard: res.guard}
		} else {
			r.extra = append(r.extra, res.guard)
		}
	}
	var what string
	switch {
	case res.safety:
		what = fmt.Sprintf("no outcome within the runner's safety (then %v)", res.err)
	case res.guard != nil:
		what = fmt.Sprintf("granted (fence %d, session %d)", res.guard.Fence(), res.guard.SessionID())
	default:
		what = describeErr(res.err)
		if got != "" {
			what = got + ": " + what
		}
	}
	if got != st.outcome {
		return fmt.Errorf("want %s, got %s after %v", st.outcome, what, res.elapsed.Round(time.Millisecond))
	}
	if st.MessageContains != nil && !strings.Contains(res.err.Error(), *st.MessageContains) {
		return fmt.Errorf("want a message with %q, got %s", *st.MessageContains, what)
	}
	if st.MinElapsedMs != nil && res.elapsed < time.Duration(*st.MinElapsedMs)*time.Millisecond {
		return fmt.Errorf("%s after %v, under min_elapsed_ms", what, res.elapsed.Round(time.Millisecond))
	}
	if st.MaxElapsedMs != nil && res.elapsed > time.Duration(*st.MaxElapsedMs)*time.Millisecond {
		return fmt.Errorf("%s after %v, over max_elapsed_ms", what, res.elapsed.Round(time.Millisecond))
	}
	if st.FenceAbove != "" {
		below, err := r.grant(st.FenceAbove)
		if err != nil {
			return err
		}
		if res.guard.Fence() <= below.guard.Fence() {
			return fmt.Errorf("%s: the fence is not above %s's %d", what, st.FenceAbove, below.guard.Fence())
		}
	}
	return nil
}

// describe polls Describe until name has that many holders and waiters,
// for up to 10 s.
func (r *scenarioRun) describe(name string, holders, waiters int) error {
	deadline := time.Now().Add(10 * time.Second)
	body, _ := json.Marshal(describeRequest{Name: name})
	last := "no answer"
	for {
		var d describeResponse
		left := time.Until(deadline)
		if left < time.Second {
			left = time.Second
		}
		if err := r.cl.leaderPost("locks/Describe", string(body), &d, left); err != nil {
			last = err.Error()
		} else {
			h, w := len(d.Info.Holders), len(d.Info.Waiters)
			if h == holders && w == waiters {
				return nil
			}
			last = fmt.Sprintf("%d holders and %d waiters: %+v", h, w, d)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("within 10 s Describe never gave %d holders and %d waiters; last: %s", holders, waiters, last)
		}
		time.Sleep(50 * time.Millisecond) // polling interval, under the deadline
	}
}

// leaderPost sends an operator's request to the leader (found with
// Status on the running nodes) and decodes its answer into out, trying
// again (another leader, another attempt) until within passes.
func (c *testCluster) leaderPost(rpc, body string, out interface{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	last := "no leader known"
	for {
		leader := ""
		for _, n := range c.nodes {
			if n.cmd == nil {
				continue
			}
			if s, err := c.status(n.addr); err == nil && s.LeaderAddr != "" {
				leader = s.LeaderAddr
				break
			}
		}
		if leader != "" {
			status, answer, err := c.post(leader, rpc, body, deadline)
			switch {
			case err != nil:
				last = fmt.Sprintf("%s: %v", leader, err)
			case status == http.StatusOK:
				if out == nil {
					return nil
				}
				return json.Unmarshal(answer, out)
			case status == http.StatusServiceUnavailable:
				last = fmt.Sprintf("%s: HTTP %d %s", leader, status, answer)
			default:
				return fmt.Errorf("%s on %s: HTTP %d %s", rpc, leader, status, answer)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no leader answered within %v (last: %s)", rpc, within, last)
		}
		time.Sleep(50 * time.Millisecond) // polling interval, under the deadline
	}
}

// post sends one request to one node.
func (c *testCluster) post(addr, rpc, body string, deadline time.Time) (int, []byte, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.scheme+"://"+addr+"/v1/"+rpc, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// The runner refuses what it does not understand before it runs anything.
func TestScenarioStepsAreCheckedAsRead(t *testing.T) {
	actors := map[string]scenarioActor{"a": {}}
	for _, tc := range []struct{ step, says string }{
		{`{"op": "lock", "actor": "a", "name": "x", "expect": "granted"}`, ""},
		{`{"op": "lock", "actor": "a", "name": {"repeat": "n", "times": 3}, "expect": "granted"}`, ""},
		{`{"op": "unlock", "grant": "a1"}`, `unknown op "unlock"`},
		{`{"op": "lock", "actor": "a", "name": "x", "expect": "held"}`, `unknown expect "held"`},
		{`{"op": "lock", "actor": "a", "name": "x", "expect": "cancelled"}`, "only a started lock"},
		{`{"op": "release", "grant": "a1", "expect": "granted"}`, `unknown expect "granted"`},
		{`{"op": "check_fence", "grant": "a1", "expect": "yes"}`, "want true or false"},
		{`{"op": "lock", "actor": "a", "name": "x", "expect": "granted", "within_ms": 5}`, `takes no "within_ms"`},
		{`{"op": "lock", "actor": "a", "name": "x", "expect": "granted", "wait": true}`, `unknown field "wait"`},
		{`{"op": "lock", "actor": "a", "name": "x"}`, `needs "expect"`},
		{`{"op": "lock", "actor": "b", "name": "x", "expect": "granted"}`, `no actor "b"`},
		{`{"op": "lock", "actor": "a", "name": "x", "mode": "read", "expect": "granted"}`, `unknown mode "read"`},
		{`{"op": "lock", "actor": "a", "name": {"repeat": "n"}, "expect": "granted"}`, "a name is"},
	} {
		_, err := parseStep(json.RawMessage(tc.step), actors)
		if tc.says == "" && err != nil || tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)) {
			t.Errorf("%s: %v, want an error saying %q", tc.step, err, tc.says)
		}
	}
}
