package launch

import (
	"fmt"
	"slices"
	"strings"
)

// sessionVars are what ExportEnv's ALL leaves out: they belong to the
// caller's session or host, not to the job (a rank gets its own CAIRN_*
// and hostname).
var sessionVars = []string{"SSH_", "DISPLAY=", "XAUTHORITY=", "DBUS_", "XDG_", "SHLVL=", "OLDPWD=", "PWD=", "_=",
	"CAIRN_", "KRB5CCNAME=", "GPG_AGENT_INFO=", "HOSTNAME=", "MAIL=", "LS_COLORS=", "TMUX", "STY=", "WINDOW="}

// ExportEnv picks what of the caller's environment env a job's ranks get,
// as srun --export does: ALL (less the caller's session's variables),
// NONE, or a comma-separated list of names.
func ExportEnv(spec string, env []string) ([]string, error) {
	switch spec {
	case "NONE":
		return nil, nil
	case "ALL", "":
		var out []string
		for _, kv := range env {
			if !slices.ContainsFunc(sessionVars, func(p string) bool { return strings.HasPrefix(kv, p) }) {
				out = append(out, kv)
			}
		}
		return out, nil
	}
	var out []string
	for _, name := range strings.Split(spec, ",") {
		if name == "" || strings.ContainsAny(name, "= ") {
			return nil, fmt.Errorf("%q: want ALL, NONE or VAR,VAR", spec)
		}
		for _, kv := range env {
			if strings.HasPrefix(kv, name+"=") {
				out = append(out, kv)
			}
		}
	}
	return out, nil
}
