//! A session's mailbox: the speaker's commands to one session task, unbounded and in order.
//!
//! Why not tokio's unbounded channel: it costs some 1.3 KB per session before the first
//! message (a cache-padded channel and a first block of 32 slots), and a mesh node has a
//! session per node, most of which see a handful of commands in their life. This is a queue
//! under a mutex and a [`Notify`]: about a hundred bytes, growing only while commands wait.
//!
//! Semantics are the channel's: [`Sender::send`] never waits and fails only once the
//! receiver is gone; [`Receiver::recv`] yields `None` once every sender is dropped and the
//! queue is empty, and is cancel-safe (a command is taken only when it is returned).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Wakes the receiver: a command arrived or the last sender left.
    notify: Notify,
}

struct State<T> {
    queue: VecDeque<T>,
    senders: usize,
    receiving: bool,
}

/// Capacity kept by an emptied queue; a burst's larger buffer is given back.
const KEEP: usize = 4;

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // The critical sections cannot panic halfway (push, pop, counters).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Sender<T>(Arc<Shared<T>>);
pub struct Receiver<T>(Arc<Shared<T>>);

/// A new mailbox.
pub fn mailbox<T>() -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            senders: 1,
            receiving: true,
        }),
        notify: Notify::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl<T> Sender<T> {
    /// Queues `command`; gives it back when the receiver is gone.
    pub fn send(&self, command: T) -> Result<(), T> {
        {
            let mut s = self.0.lock();
            if !s.receiving {
                return Err(command);
            }
            s.queue.push_back(command);
        }
        self.0.notify.notify_one();
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let last = {
            let mut s = self.0.lock();
            s.senders -= 1;
            s.senders == 0
        };
        if last {
            self.0.notify.notify_one();
        }
    }
}

impl<T> Receiver<T> {
    /// The next command; `None` once every sender is gone and nothing is queued.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            // Registered before looking: a send between the look and the wait still wakes it
            // (notify_one keeps a permit when nobody waits).
            let notified = self.0.notify.notified();
            {
                let mut s = self.0.lock();
                if let Some(c) = s.queue.pop_front() {
                    if s.queue.is_empty() && s.queue.capacity() > KEEP {
                        s.queue.shrink_to(KEEP);
                    }
                    return Some(c);
                }
                if s.senders == 0 {
                    return None;
                }
            }
            notified.await;
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.receiving = false;
        // Queued commands are dropped here, not when the last sender goes.
        s.queue = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn commands_arrive_in_order_then_none_once_every_sender_left() {
        let (tx, mut rx) = mailbox();
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        tx2.send(2).unwrap();
        tx.send(3).unwrap();
        assert_eq!(rx.recv().await, Some(1));
        assert_eq!(rx.recv().await, Some(2));
        drop(tx);
        // One sender left: still open, the queued command comes.
        assert_eq!(rx.recv().await, Some(3));
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "returned while a sender was left");
        drop(tx2);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(got.expect("woken by the last sender").unwrap(), None);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_by_a_send() {
        let (tx, mut rx) = mailbox();
        let waiting = tokio::spawn(async move { rx.recv().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.send("go").unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(got.expect("woken").unwrap(), Some("go"));
    }

    #[tokio::test]
    async fn an_abandoned_receive_loses_nothing() {
        let (tx, mut rx) = mailbox();
        // A receive given up before anything came (a select! whose other branch won).
        let gave_up = tokio::time::timeout(Duration::from_millis(10), rx.recv()).await;
        assert!(gave_up.is_err());
        tx.send(7).unwrap();
        assert_eq!(rx.recv().await, Some(7));
    }

    #[test]
    fn sending_to_a_dropped_receiver_gives_the_command_back() {
        let (tx, rx) = mailbox();
        tx.send(1).unwrap();
        drop(rx);
        assert_eq!(tx.send(2), Err(2));
    }

    #[tokio::test]
    async fn a_burst_does_not_keep_its_buffer() {
        let (tx, mut rx) = mailbox();
        for i in 0..1000 {
            tx.send(i).unwrap();
        }
        for i in 0..1000 {
            assert_eq!(rx.recv().await, Some(i));
        }
        assert!(rx.0.lock().queue.capacity() <= KEEP);
    }
}
