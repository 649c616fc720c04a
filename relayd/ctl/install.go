package ctl

import (
	"context"
	"errors"
	"fmt"

	"github.com/kl-egress/kl/relayd/install"
)

func init() {
	for _, verb := range []string{"install", "uninstall"} {
		Register(Command{Name: verb, Summary: map[string]string{"install": "add kl to", "uninstall": "take kl out of"}[verb] + " the node's CNI configuration, containerd or dockerd (prints a diff)", Run: installer(verb)})
	}
}

// installer runs package install for one verb; its --watch runs until kl-ctl is
// terminated (ctx carries SIGTERM).
func installer(verb string) func(ctx context.Context, env *Env, args []string) error {
	return func(ctx context.Context, env *Env, args []string) error {
		if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			w := env.Stdout
			if len(args) == 0 {
				w = env.Stderr
			}
			fmt.Fprintln(w, "usage: "+install.Usage)
			if len(args) == 0 {
				return &ExitError{Code: ExitInvalid}
			}
			return nil
		}
		err := install.Run(ctx, append([]string{verb}, args...), env.Stdout, env.Stderr)
		var ue *install.UsageError
		if errors.As(err, &ue) {
			if !ue.Reported {
				fmt.Fprintf(env.Stderr, "kl-ctl %s: %v\n", verb, err)
			}
			return &ExitError{Code: ExitInvalid, Err: err}
		}
		return err
	}
}
