package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// daemonFlags are what both daemons (agent, coordinator) take besides
// their own: logging, and the health endpoint.
type daemonFlags struct {
	logLevel, logFormat, healthListen string
}

func (d *daemonFlags) add(f *pflag.FlagSet) {
	f.StringVar(&d.logLevel, "log-level", "info", "least severe messages logged: debug, info, warn or error")
	f.StringVar(&d.logFormat, "log-format", "text", "log lines as text (key=value) or json, one object a line")
	f.StringVar(&d.healthListen, "health-listen", "", "serve GET /healthz (plain HTTP, no authentication, no data: 200 ok while serving) on this address, e.g. 127.0.0.1:7421")
}

// logger is the daemon's logger on w, by --log-level and --log-format.
func (d *daemonFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(d.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", d.logLevel)}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch d.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, usageError{fmt.Errorf("--log-format %q: want text or json", d.logFormat)}
}

// envAnnotation marks a flag that also comes from the environment: its
// variable's name (nameVars).
const envAnnotation = "cairn.env-prefix"

// nameVars gives every flag of fs that names no variable of its own yet
// ("($CAIRN_…" in its usage) one: prefix
// and the flag's name, upper case, '-' as '_' (the agent's
// --health-every is $CAIRN_AGENT_HEALTH_EVERY), as systemd's
// EnvironmentFile= sets them, and says so in its usage. A flag given on
// the command line wins over its variable (applyEnv, before the command
// runs).
func nameVars(fs *pflag.FlagSet, prefix string) {
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Name != "help" && !strings.Contains(f.Usage, "($CAIRN_") {
			name := prefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
			f.Usage += " ($" + name + ")"
			if f.Annotations == nil {
				f.Annotations = map[string][]string{}
			}
			f.Annotations[envAnnotation] = []string{name}
		}
	})
}

// applyEnv sets each flag of fs that nameVars named a variable for, and
// that the command line did not set, from its variable if that is set and
// not empty. A repeatable flag takes its values from the variable split
// into words as a shell would (quotes group words). A value the flag
// refuses is a usage error naming the variable.
func applyEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		names := f.Annotations[envAnnotation]
		if f.Changed || len(names) != 1 {
			return
		}
		name := names[0]
		v := os.Getenv(name)
		if v == "" {
			return
		}
		var err error
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			var words []string
			if words, err = splitWords(v); err == nil {
				err = sv.Replace(words)
			}
		} else {
			err = f.Value.Set(v)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("$%s=%q (--%s): %w", name, v, f.Name, err))
		}
		// Not marked Changed: a variable is the environment's setting, not
		// a flag given to this command, which a command that the flag does
		// not apply to would refuse (notWith).
	})
	if len(errs) > 0 {
		return usageError{errs[0]}
	}
	return nil
}

// envPreRun applies the environment to the root's persistent flags
// ($CAIRN_…) and to the command's own flags, where nameVars named
// variables.
func envPreRun(root *cobra.Command) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := applyEnv(root.PersistentFlags()); err != nil {
			return err
		}
		return applyEnv(cmd.LocalNonPersistentFlags())
	}
}

// splitWords splits s at blanks outside quotes: 'single' quotes keep
// everything, "double" quotes all but a backslash before " or \.
func splitWords(s string) ([]string, error) {
	var out []string
	var w strings.Builder
	in, quote := false, rune(0)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote == '\'' && r == '\'', quote == '"' && r == '"':
			quote = 0
		case quote == '"' && r == '\\' && i+1 < len(rs) && (rs[i+1] == '"' || rs[i+1] == '\\'):
			i++
			w.WriteRune(rs[i])
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if in {
				out = append(out, w.String())
				w.Reset()
				in = false
			}
		default:
			w.WriteRune(r)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		out = append(out, w.String())
	}
	return out, nil
}
