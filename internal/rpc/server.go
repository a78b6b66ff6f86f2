package rpc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	agentv1 "github.com/cairn-hpc/cairn/api/agent/v1"
	coordv1 "github.com/cairn-hpc/cairn/api/coord/v1"
	"github.com/cairn-hpc/cairn/internal/pki"
)

// Serve serves h on ln with mutual TLS from creds until ctx is done, then
// shuts down, giving requests in flight 5 s.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, creds *pki.Credentials, log *slog.Logger) error {
	return ServeTLS(ctx, ln, h, pki.ServerConfig(creds), log)
}

// ServeTLS is Serve with a TLS configuration of the caller's (from
// pki.ServerConfig or pki.ServerConfigOptionalCert).
func ServeTLS(ctx context.Context, ln net.Listener, h http.Handler, conf *tls.Config, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hs := &http.Server{
		Handler:           h,
		TLSConfig:         conf,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	return Run(ctx, hs, tls.NewListener(ln, conf))
}

// Run serves hs on ln until ctx is done, then shuts it down, giving
// requests in flight 5 s.
func Run(ctx context.Context, hs *http.Server, ln net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Caller returns who made the request, from its client certificate; if
// there is none, it answers 401 and returns false.
func Caller(w http.ResponseWriter, r *http.Request) (pki.Identity, bool) {
	if r.TLS == nil {
		Fail(w, http.StatusUnauthorized, agentv1.CodeUnauthorized, "TLS required")
		return pki.Identity{}, false
	}
	id, err := pki.PeerIdentity(*r.TLS)
	if err != nil {
		Fail(w, http.StatusUnauthorized, agentv1.CodeUnauthorized, err.Error())
		return pki.Identity{}, false
	}
	return id, true
}

// statusOf is the HTTP status each error code of the two APIs is sent with.
var statusOf = map[string]int{
	agentv1.CodeBadRequest:   http.StatusBadRequest,
	agentv1.CodeUnauthorized: http.StatusUnauthorized,
	agentv1.CodeForbidden:    http.StatusForbidden,
	agentv1.CodeNotFound:     http.StatusNotFound,
	agentv1.CodeNoSuchRound:  http.StatusNotFound,
	coordv1.CodeNoCkpt:       http.StatusNotFound,
	agentv1.CodeExists:       http.StatusConflict,
	agentv1.CodeRunning:      http.StatusConflict,
	agentv1.CodeNotRunning:   http.StatusConflict,
	coordv1.CodeConflict:     http.StatusConflict,
	coordv1.CodeAborted:      http.StatusConflict,
	agentv1.CodeCorrupt:      http.StatusUnprocessableEntity,
	agentv1.CodeCRIU:         http.StatusServiceUnavailable,
	coordv1.CodeNoNodes:      http.StatusServiceUnavailable,
	coordv1.CodeNodeDead:     http.StatusServiceUnavailable,
	coordv1.CodeNotLeader:    http.StatusServiceUnavailable,
	coordv1.CodeDeposed:      http.StatusServiceUnavailable,
	coordv1.CodeVersion:      http.StatusConflict,
}

// FailError answers with e, with the HTTP status of its code (500 for
// codes without one of their own).
func FailError(w http.ResponseWriter, e *agentv1.Error) {
	status, ok := statusOf[e.Code]
	if !ok {
		status = http.StatusInternalServerError
	}
	WriteJSON(w, status, e)
}

// WriteJSON answers with status and v as JSON (no body if v is nil).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

// Fail answers with an Error body.
func Fail(w http.ResponseWriter, status int, code, msg string) {
	WriteJSON(w, status, &agentv1.Error{Code: code, Message: msg})
}

// Decode reads a JSON request body of at most 1 MiB with no unknown
// fields into v; on error it answers 400 and returns false.
func Decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return DecodeLimit(w, r, v, 1<<20)
}

// DecodeLimit is Decode with a limit of its own, for the few requests
// that carry long lists.
func DecodeLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		Fail(w, http.StatusBadRequest, agentv1.CodeBadRequest, "request body: "+err.Error())
		return false
	}
	return true
}
