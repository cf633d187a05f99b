package pluginmanager

import (
	"context"
	"testing"
)

// Only a HandlerFuncs func left nil is skipped; anything else is called.
func TestUnset(t *testing.T) {
	validate := func(context.Context, Plugin) error { return nil }
	some := HandlerFuncs{ValidateFunc: validate}
	for _, tc := range []struct {
		h    Handler
		op   string
		want bool
	}{
		{HandlerFuncs{}, "Validate", true},
		{HandlerFuncs{}, "Register", true},
		{HandlerFuncs{}, "Deregister", true},
		{some, "Validate", false},
		{some, "Register", true},
		{&some, "Validate", false},
		{&some, "Register", true},
		{(*HandlerFuncs)(nil), "Validate", false},
		{KubeletHandler(nil), "Validate", false},
		{HandlerFuncs{}, "Observe", false},
	} {
		if got := unset(tc.h, tc.op); got != tc.want {
			t.Errorf("unset(%T, %s) = %v, want %v", tc.h, tc.op, got, tc.want)
		}
	}
}
