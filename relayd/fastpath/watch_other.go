//go:build !linux

package fastpath

import "errors"

func (m *Manager) watch(po *pod) (stop func(), err error) {
	return nil, errors.ErrUnsupported
}

func (m *Manager) rewatch(po *pod) error { return errors.ErrUnsupported }

func (po *pod) inNetns(string) bool { return false }

func reachable(string) error { return errors.ErrUnsupported }

type poller struct{}

func (m *Manager) closePoller() {}
