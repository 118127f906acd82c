package raftlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Bad input the client refuses before sending anything is the same kind
// of error as the node's refusal of bad input: an *Error with Code
// "INVALID_ARGUMENT" (HTTPStatus 0: no node was asked), so that a caller
// (and the shared scenarios) can tell it from a transport failure without
// reading the message. No node listens on the endpoint: nothing may be
// sent.
func TestClientRefusalsAreInvalidArgument(t *testing.T) {
	want := func(what string, err error, contains string) {
		t.Helper()
		var e *Error
		if !errors.As(err, &e) || e.Code != "INVALID_ARGUMENT" || e.HTTPStatus != 0 {
			t.Errorf("%s: %v (%T), want an *Error with Code INVALID_ARGUMENT and HTTPStatus 0", what, err, err)
			return
		}
		if !strings.Contains(err.Error(), contains) {
			t.Errorf("%s: %v, want it to say %q", what, err, contains)
		}
	}
	for _, eps := range []string{"", "ftp://127.0.0.1:1", "127.0.0.1", "http://127.0.0.1:1/path"} {
		_, err := New(eps, Options{})
		want("New("+eps+")", err, "endpoint")
	}
	_, err := New("127.0.0.1:1", Options{TTL: MaxTTL + time.Millisecond})
	want("New with a TTL past MaxTTL", err, "TTL")

	c, err := New("127.0.0.1:1", Options{RetryTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range []string{"", strings.Repeat("n", MaxKeyBytes+1), "\xff"} {
		_, err := c.Acquire(ctx, k, AcquireOptions{Try: true})
		want(fmt.Sprintf("Acquire of a key of %d bytes", len(k)), err, "512")
		_, err = c.CheckFence(ctx, k, 1)
		want(fmt.Sprintf("CheckFence of a key of %d bytes", len(k)), err, "512")
	}
	_, err = c.Acquire(ctx, "ok", AcquireOptions{TTL: MinTTL - time.Millisecond})
	want("Acquire with a TTL under MinTTL", err, "TTL")
	_, err = c.AcquireAll(ctx, nil, AcquireOptions{})
	want("AcquireAll of no keys", err, "keys")
	_, err = c.AcquireAll(ctx, []Spec{{Key: "a"}, {Key: "a"}}, AcquireOptions{})
	want("AcquireAll of a key twice", err, "twice")
	_, err = c.AcquireAll(ctx, []Spec{{Key: ""}}, AcquireOptions{})
	want("AcquireAll of an empty key", err, "512")
}
