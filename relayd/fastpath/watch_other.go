//go:build !linux

package fastpath

import "errors"

func (m *Manager) watch(po *pod) (stop func(), err error) {
	return nil, errors.ErrUnsupported
}

type poller struct{}

func (m *Manager) closePoller() {}
