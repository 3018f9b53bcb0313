package main

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-mix", "new=0"},
		{"-mix", "bogus=1"},
		{"-duration", "0s"},
		{"-duration", "11m"},
		{"-concurrency", "0"},
		{"-body", "-1"},
		{"-rounds", "0"},
		{"-redis", "10.1.2.3:6379"},
		{"-redis", "example.com:6379"},
		{"extra"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if errOut.Len() == 0 {
			t.Errorf("%q: no message", args)
		}
		if out.Len() != 0 {
			t.Errorf("%q: measured anyway: %s", args, out.String())
		}
	}
}

var middlewareLine = regexp.MustCompile(`(?m)^middleware +\d+ .*\b(\d+\.\d\d)x bare`)

func TestMemstoreRun(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"-duration", "1100ms", "-concurrency", "4", "-warm", "20", "-body", "256"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{"store=memstore", "[bare", "[middleware", "statuses 201: "} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if !middlewareLine.MatchString(s) {
		t.Errorf("no middleware line with a ratio to bare:\n%s", s)
	}
	if strings.Contains(s, "floor") {
		t.Errorf("memstore run measured a Redis floor:\n%s", s)
	}
}

func TestRedisAutoRun(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not on PATH")
	}
	var out, errOut bytes.Buffer
	code := run([]string{"-redis", "auto", "-duration", "300ms", "-concurrency", "2", "-warm", "10", "-mix", "new=50,dup=50"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	s := out.String()
	if !regexp.MustCompile(`(?m)^middleware .*x bare, \d+\.\d\dx recordfloor`).MatchString(s) {
		t.Errorf("no ratios to bare and the record floor:\n%s", s)
	}
	if !regexp.MustCompile(`(?m)^recordfloor +\d+`).MatchString(s) {
		t.Errorf("no record floor line:\n%s", s)
	}
}
