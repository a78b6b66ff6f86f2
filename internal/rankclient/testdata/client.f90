! client.f90: cairn.f90's interfaces against ranktest's fake endpoint,
! driven by clients_test.go.
program client
  use cairn
  implicit none
  type(cairn_info_t) :: info
  type(cairn_result_t) :: res
  integer(c_int) :: rc

  rc = cairn_info(info)
  print '(a,i0,1x,a,1x,i0,1x,i0,1x,a,1x,i0)', 'info ', rc, cairn_string(info%job), info%rank, info%size, &
      cairn_string(info%mode), info%ckpt
  rc = cairn_checkpoint(res)
  print '(a,i0,1x,i0,1x,i0)', 'checkpoint ', rc, res%state, res%ckpt
  rc = cairn_event('fortran'//c_null_char, 'from Fortran'//c_null_char)
  print '(a,i0)', 'event ', rc
  print '(a)', 'strerror ' // cairn_strerror(CAIRN_EFORBIDDEN)
end program
