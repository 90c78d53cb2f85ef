/*-------------------------------------------------------------------------
 *
 * ddl_guard.h
 *	  The DDL guard of the tables of keys and tombstones (ddl_guard.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DDL_GUARD_H
#define IDEM_DDL_GUARD_H

/* SPI_execute(sql, false, 0) of the extension's own DDL: the guard stands aside */
extern int	IdemRunOwnDDL(const char *sql);

#endif							/* IDEM_DDL_GUARD_H */
