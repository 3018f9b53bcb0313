package main

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"
)

// accounts is the demo's credential table: each user and the bearer token
// that authenticates them. A real server verifies a session, a signed token
// or a hashed API key instead.
var accounts = []struct{ user, token string }{
	{"alice", "alice-token"},
	{"bob", "bob-token"},
}

// userKey is the request context key under which authenticate puts the user.
type userKey struct{}

// authenticate verifies the request's bearer token and puts its user in the
// request's context. A request without a valid token gets 401 and goes no
// further: every handler behind it, the idempotency middleware included,
// sees an authenticated user.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, ok := verify(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="chi-server"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "missing or unknown bearer token"})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, u)))
	})
}

// verify returns the user whose token the Authorization header carries.
// The tokens are compared in constant time, so that the time taken does
// not tell how much of a guess was right.
func verify(authorization string) (string, bool) {
	scheme, token, _ := strings.Cut(authorization, " ")
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	for _, a := range accounts {
		if subtle.ConstantTimeCompare([]byte(token), []byte(a.token)) == 1 {
			return a.user, true
		}
	}
	return "", false
}

// user returns the user authenticate verified for r: the principal that
// owns the request's idempotency keys and payments. It is "" only for a
// request that did not pass through authenticate.
func user(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}
