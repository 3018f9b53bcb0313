package replaycache

// Waiters returns how many callers joined the store call in progress for
// key, or -1 when there is none.
func (c *Cache) Waiters(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.flights[key]; f != nil {
		return f.waiters
	}
	return -1
}
