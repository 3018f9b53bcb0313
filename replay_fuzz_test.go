package idempotency_test

import (
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// FuzzReplay replays records that hold arbitrary headers (given as
// "name: value" lines), statuses and bodies, as a tampered or foreign
// record would, to GET-less POSTs and HEADs. A replay must never panic and
// never send what the middleware would not have stored: no Set-Cookie
// (the option is off), no hop-by-hop header or one the record's Connection
// names, no Date, and a Content-Length that is the length of the body it
// sends.
func FuzzReplay(f *testing.F) {
	f.Add(201, "Content-Type: application/json\nSet-Cookie: sid=1", []byte(`{"ok":true}`), false)
	f.Add(200, "Connection: close, X-Hop\nX-Hop: 1\nTransfer-Encoding: chunked\nContent-Length: 99", []byte("short"), false)
	f.Add(204, "Content-Length: 10\nkeep-alive: timeout=5", []byte{}, false)
	f.Add(200, "Content-Length: 12345", []byte{}, true)
	f.Add(599, "set-cookie: a=b\nSET-COOKIE: c=d\ndate: today", []byte("x"), true)

	hidden := map[string]bool{"Set-Cookie": true, "Date": true, "Connection": true, "Keep-Alive": true,
		"Transfer-Encoding": true, "Te": true, "Trailer": true, "Upgrade": true, "Proxy-Connection": true,
		"Proxy-Authenticate": true, "Proxy-Authorization": true}
	f.Fuzz(func(t *testing.T, status int, lines string, body []byte, head bool) {
		if status < 200 || status > 599 {
			return
		}
		header := http.Header{}
		for _, line := range strings.Split(lines, "\n") {
			if name, value, ok := strings.Cut(line, ":"); ok && name != "" {
				header[name] = append(header[name], strings.TrimSpace(value))
			}
		}
		named := map[string]bool{}
		for k, vv := range header {
			if textproto.CanonicalMIMEHeaderKey(k) == "Connection" {
				for _, v := range vv {
					for _, n := range strings.Split(v, ",") {
						named[textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(n))] = true
					}
				}
			}
		}
		forged := &idempotency.Response{Status: status, Header: header, Body: body}
		store := &forgingStore{Store: newMemStore(t), resp: forged}
		method := http.MethodPost
		if head {
			method = http.MethodHead
		}
		mw := idempotency.New(store, idempotency.WithMethods(http.MethodPost, http.MethodHead))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
		}))
		for i := range 2 {
			req := httptest.NewRequest(method, "/", nil)
			req.Header.Set(idempotency.HeaderKey, "k")
			rec := httptest.NewRecorder()
			mw.ServeHTTP(rec, req)
			if i == 0 {
				continue // the first request runs the handler
			}
			if rec.Header().Get(idempotency.HeaderReplayed) != "true" {
				t.Fatalf("not a replay: %d %v", rec.Code, rec.Header())
			}
			for k := range rec.Header() {
				ck := textproto.CanonicalMIMEHeaderKey(k)
				if hidden[ck] || named[ck] || strings.HasPrefix(ck, "Trailer:") {
					t.Fatalf("replay sends %s: %q", k, rec.Header()[k])
				}
			}
			sent := rec.Body.Len()
			if cl := rec.Header().Values("Content-Length"); len(cl) > 1 {
				t.Fatalf("replay sends %d Content-Length values", len(cl))
			} else if len(cl) == 1 && !head {
				if n, err := strconv.Atoi(cl[0]); err != nil || n != sent {
					t.Fatalf("replay's Content-Length %q for a body of %d bytes", cl[0], sent)
				}
			}
		}
	})
}
