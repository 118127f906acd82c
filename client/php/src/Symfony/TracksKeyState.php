<?php

declare(strict_types=1);

namespace Raftlock\Symfony;

use Symfony\Component\Lock\Key as LockKey;
use Symfony\Component\Semaphore\Key as SemaphoreKey;

/**
 * The session state a store keeps in a Symfony Key, under the store's own
 * class name, and the client's count of it. Used by both stores, which
 * keep their Client in `$this->client`.
 *
 * @internal
 */
trait TracksKeyState
{
    /**
     * The Key's session, counted by the client (a Key from another process
     * is tracked from here on: not held until a renewal is answered).
     * `__CLASS__` is the store using this trait.
     *
     * @return array<string, mixed>|null session, fence, next_seq, ttl_ms,
     *     grace_ms, and what else the store keeps
     */
    private function state(LockKey|SemaphoreKey $key): ?array
    {
        if (!$key->hasState(__CLASS__)) {
            return null;
        }
        $state = $key->getState(__CLASS__) + ['grace_ms' => 0];
        $this->client->track($state['session'], $state['ttl_ms'], $state['grace_ms']);

        return $state;
    }
}
