<?php

declare(strict_types=1);

namespace Raftlock\Symfony;

use Raftlock\Client;
use Raftlock\RaftlockException;
use Symfony\Component\Semaphore\Exception\InvalidArgumentException;
use Symfony\Component\Semaphore\Exception\SemaphoreAcquiringException;
use Symfony\Component\Semaphore\Exception\SemaphoreExpiredException;
use Symfony\Component\Semaphore\Key;
use Symfony\Component\Semaphore\PersistingStoreInterface;

/**
 * Symfony Semaphore's store on a raftlock cluster: a raftlock semaphore
 * whose capacity is the Key's limit, each Key taking its weight in
 * permits, with a fence per grant.
 *
 *     $store = new RaftlockSemaphoreStore('http://node1:7101,http://node2:7101,http://node3:7101');
 *     $semaphore = (new SemaphoreFactory($store))->createSemaphore('thumbnails', 10);
 *
 * Each acquired Key holds a session of its own, opened and acquired in one
 * write (Lock) with the Semaphore's ttl and ended in one (Unlock);
 * `refresh($ttl)` restarts it (KeepAlive, or SetSessionTtl when the ttl
 * changes). Every Key of one name must have the same limit: a Key with
 * another limit while permits are held is refused (FAILED_PRECONDITION,
 * which Symfony's Semaphore reports as a failure to acquire). Requests do
 * not wait: raftlock answers at once when the permits are not free.
 */
final class RaftlockSemaphoreStore implements PersistingStoreInterface
{
    use TracksKeyState;

    private Client $client;

    /**
     * @param string|Client $endpoints comma-separated node URLs, or a Client
     * @param string|null   $token     sent as "Authorization: Bearer TOKEN"
     */
    public function __construct($endpoints, ?string $token = null)
    {
        $this->client = $endpoints instanceof Client ? $endpoints : new Client($endpoints, $token);
    }

    public function save(Key $key, float $ttlInSecond): void
    {
        $ttlMs = self::ttlMs($ttlInSecond);
        if ($key->getLimit() > Client::MAX_CAPACITY) {
            throw new InvalidArgumentException(sprintf('raftlock semaphores hold at most %d permits, got a limit of %d.', Client::MAX_CAPACITY, $key->getLimit()));
        }
        $state = $this->state($key);
        if (null !== $state) {
            if ($this->client->checkFence((string) $key, $state['fence'])) {
                $this->renew($key, $state, $ttlMs);

                return;
            }
            $this->client->unlock($state['session']);
            $key->removeState(__CLASS__);
        }
        $r = $this->client->lock((string) $key, $ttlMs, 0, Client::SEMAPHORE, $key->getWeight(), $key->getLimit());
        if (!$r['acquired']) {
            throw new SemaphoreAcquiringException($key, sprintf('%d of its %d permits are not free', $key->getWeight(), $key->getLimit()));
        }
        $key->setState(__CLASS__, [
            'session' => $r['session_id'],
            'fence' => $r['fence'],
            'next_seq' => $r['next_seq'],
            'ttl_ms' => $r['ttl_ms'] ?: $ttlMs,
            'grace_ms' => $this->client->endOnDisconnectMs(),
        ]);
        $this->setLifetime($key, $r['session_id']);
    }

    public function putOffExpiration(Key $key, float $ttlInSecond): void
    {
        $ttlMs = self::ttlMs($ttlInSecond);
        $state = $this->state($key);
        if (null === $state) {
            throw new SemaphoreExpiredException($key, 'it is not held through this key');
        }
        $this->renew($key, $state, $ttlMs);
    }

    public function delete(Key $key): void
    {
        $state = $this->state($key);
        if (null === $state) {
            return;
        }
        $this->client->unlock($state['session']);
        $key->removeState(__CLASS__);
    }

    public function exists(Key $key): bool
    {
        $state = $this->state($key);

        if (null === $state) {
            return false;
        }
        // The fence first, the renewal last: the Key's lifetime then counts
        // from a renewal answered after the CheckFence, however long that took.
        $held = $this->client->checkFence((string) $key, $state['fence']) && $this->client->isHeld($state['session']);
        $this->setLifetime($key, $state['session']);

        return $held && !$key->isExpired();
    }

    /** The fence of the permits $key holds, or null if it holds none. */
    public static function fence(Key $key): ?int
    {
        $state = $key->hasState(__CLASS__) ? $key->getState(__CLASS__) : null;

        return null === $state ? null : $state['fence'];
    }

    /**
     * @param array{session: int, fence: int, next_seq: int, ttl_ms: int} $state
     */
    private function renew(Key $key, array $state, int $ttlMs): void
    {
        if ($ttlMs === $state['ttl_ms']) {
            $alive = $this->client->keepAlive($state['session']);
        } else {
            $seq = $state['next_seq'];
            $state['next_seq'] = $seq + 1;
            $key->setState(__CLASS__, $state);
            try {
                $this->client->setSessionTtl($state['session'], $seq, $ttlMs);
                $state['ttl_ms'] = $ttlMs;
                $key->setState(__CLASS__, $state);
                $alive = true;
            } catch (RaftlockException $e) {
                if ('NOT_FOUND' !== $e->getStatus()) {
                    throw $e;
                }
                $alive = false;
            }
        }
        if ($alive && 'jeopardy' === $this->client->state($state['session'])) {
            // Answered, but late (a busy machine): renew again.
            $alive = $this->client->isHeld($state['session']) || 'lost' !== $this->client->state($state['session']);
        }
        if (!$alive) {
            $key->removeState(__CLASS__);
            $key->reduceLifetime(0);
            throw new SemaphoreExpiredException($key, 'its session ended');
        }
        $this->setLifetime($key, $state['session']);
    }

    /**
     * The Key's lifetime: what the client's count still believes (0 in
     * jeopardy or once lost). Semaphore::acquire() and refresh() then
     * shorten it to their ttl at most, which leaves it as it is.
     */
    private function setLifetime(Key $key, int $session): void
    {
        $key->resetLifetime();
        $key->reduceLifetime($this->client->heldFor($session));
    }


    private static function ttlMs(float $ttl): int
    {
        $ms = (int) ceil($ttl * 1000);
        if ($ms < Client::MIN_TTL_MS || $ms > Client::MAX_TTL_MS) {
            throw new InvalidArgumentException(sprintf('raftlock sessions last 1 to 3600 seconds, got %s.', $ttl));
        }

        return $ms;
    }
}
