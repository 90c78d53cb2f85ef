/*-------------------------------------------------------------------------
 *
 * shmem.h
 *	  The extension's shared memory: one shmem_request_hook and one
 *	  shmem_startup_hook for every module that has a part of it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_SHMEM_H
#define IDEM_SHMEM_H

/* From _PG_init: installs the two hooks when the library is preloaded. */
extern void IdemShmemInit(void);

#endif							/* IDEM_SHMEM_H */
