package dashboard

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"
)

// CookieName is the cookie a browser presents once it has logged in.
const CookieName = "cairn_ui"

// MinTokenLen is the shortest token accepted.
const MinTokenLen = 16

// ErrNotLoopback is returned for a dashboard port that is not on a
// loopback address: its token and cookie travel unencrypted.
var ErrNotLoopback = errors.New("the dashboard's port must be on a loopback address (127.0.0.1, [::1], localhost)")

// Token returns the handler of the read-only port: a browser logs in
// once at Prefix+"login?token=TOKEN" and gets a session cookie (HttpOnly,
// Secure, SameSite=Strict, for Prefix only; its value is derived from the
// token, not the token); a script may send "Authorization: Bearer TOKEN"
// instead. Without either, the page is a login form and the data is
// refused (401). Only requests addressed to a loopback name (the Host
// header) are answered, so that no other site's page, whose name was
// made to resolve to this machine, can read the dashboard.
func (d *Dashboard) Token(token []byte) http.Handler {
	return &tokenHandler{d: d, token: bytes.Clone(token), session: session(token)}
}

type tokenHandler struct {
	d       *Dashboard
	token   []byte
	session string
}

// session is the value of the cookie of a browser that presented token.
func session(token []byte) string {
	m := hmac.New(sha256.New, token)
	m.Write([]byte("cairn dashboard session"))
	return hex.EncodeToString(m.Sum(nil))
}

func (t *tokenHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w.Header())
	if !loopbackName(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, "the dashboard answers only to localhost, 127.0.0.1 or [::1]")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "the dashboard is read-only: GET and HEAD only")
		return
	}
	switch {
	case r.URL.Path == Prefix+"login":
		t.login(w, r)
	case t.authorized(r), r.URL.Path == Prefix+"style.css": // the login page's too
		t.d.ServeHTTP(w, r)
	case strings.HasPrefix(r.URL.Path, Prefix+"api/"):
		writeError(w, http.StatusUnauthorized, "log in first: "+Prefix+"login")
	default:
		t.loginPage(w, http.StatusUnauthorized, "")
	}
}

// authorized reports whether r carries the session cookie or the token.
func (t *tokenHandler) authorized(r *http.Request) bool {
	if c, err := r.Cookie(CookieName); err == nil && subtle.ConstantTimeCompare([]byte(c.Value), []byte(t.session)) == 1 {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(tok), t.token) == 1
}

// login takes the token once and answers with the session cookie.
func (t *tokenHandler) login(w http.ResponseWriter, r *http.Request) {
	tok, given := r.URL.Query()["token"]
	if !given {
		t.loginPage(w, http.StatusOK, "")
		return
	}
	if len(tok) != 1 || subtle.ConstantTimeCompare([]byte(tok[0]), t.token) != 1 {
		t.loginPage(w, http.StatusUnauthorized, "That is not the dashboard's token.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: t.session, Path: Prefix,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (t *tokenHandler) loginPage(w http.ResponseWriter, status int, msg string) {
	b, err := uiFiles.ReadFile("ui/login.html")
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// msg is one of ours, never the caller's.
	b = bytes.Replace(b, []byte("<!--message-->"), []byte(msg), 1)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// loopbackName reports whether a Host header names this machine's
// loopback: localhost, or a loopback address.
func loopbackName(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// CheckListen checks that addr (host:port) is on a loopback address.
func CheckListen(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("dashboard address %q: %w", addr, err)
	}
	if !loopbackName(host) {
		return fmt.Errorf("dashboard address %q: %w", addr, ErrNotLoopback)
	}
	return nil
}

// ReadToken reads the token in file: its content without a final
// newline, at least MinTokenLen bytes, in a file only its owner may read.
func ReadToken(file string) ([]byte, error) {
	st, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("token file %s: readable by others (mode %v); chmod 600 it", file, st.Mode().Perm())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) < MinTokenLen {
		return nil, fmt.Errorf("token file %s: the token is shorter than %d bytes", file, MinTokenLen)
	}
	return b, nil
}

// Server is the http.Server that serves h on ln, which must be on a
// loopback address (rpc.Run runs it); an event stream ends with ctx.
func Server(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) (*http.Server, error) {
	if a, err := netip.ParseAddrPort(ln.Addr().String()); err != nil || !a.Addr().IsLoopback() {
		return nil, fmt.Errorf("dashboard on %s: %w", ln.Addr(), ErrNotLoopback)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}, nil
}
